#!/usr/bin/env bash
# A local multi-process Ray cluster on loopback, for development: one head and N worker nodes, each a
# separate `ray start --block` process, with token authentication on.
#
#   cluster/local_cluster.sh start [--workers N] [--cpus C] [--dir DIR] [--port P] [--dashboard-port D]
#   cluster/local_cluster.sh env   [--dir DIR]    # prints the exports that point ray CLI / jobs at it
#   cluster/local_cluster.sh status [--dir DIR]   # how many of its nodes the GCS reports alive (exit 1: not all)
#   cluster/local_cluster.sh stop  [--dir DIR]
#
# Each node runs in a session of its own, so it outlives the terminal that started it (closing an `ssh -t`,
# a CI step or a tmux pane sends SIGHUP to that terminal's session only).
# `stop` ends only the processes `start` launched (their PIDs are in DIR/pids; each `ray start --block`
# shuts its own node down on SIGTERM). It never runs `ray stop`, which would kill every Ray on the machine.
# On SIGTERM a node first drains (for Ray Serve's proxies) for up to RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S
# seconds, 30 by Ray's default, which made `stop` wait 30 s in silence: `start` sets it to 0 (no Serve here)
# unless the environment sets it, and `stop` says how long it may wait, then how long it took.
# `start` says what it starts before each step and names the log that step's node writes (DIR/head.log,
# DIR/worker-N.log: `ray start`'s own messages go there), as a start of 30-57 s was once silent.
# The token lives in DIR/auth_token, not ~/.ray, so the cluster does not touch the user's own Ray setup.
set -euo pipefail

cmd=${1:-}; shift || true
workers=1 cpus=2 dir=${DSCORE_CLUSTER_DIR:-/tmp/dscore-local-cluster} port=6390 dashboard_port=8275
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --dashboard-port) dashboard_port=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

print_env() {  # RAY_ADDRESS: the job server, for `ray job submit`; DSCORE_RAY_ADDRESS: the GCS, for drivers (dscore --ray)
  echo "export RAY_AUTH_MODE=token"
  echo "export RAY_AUTH_TOKEN_PATH=$dir/auth_token"
  echo "export RAY_ADDRESS=http://127.0.0.1:$(cat "$dir/dashboard_port")"
  echo "export DSCORE_RAY_ADDRESS=127.0.0.1:$(cat "$dir/port")"
}

alive_nodes() {  # how many nodes the cluster's GCS reports alive
  RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$dir/auth_token" python -c '
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(sum(1 for n in ray.nodes() if n["Alive"]))' "127.0.0.1:$(cat "$dir/port")" 2>/dev/null | tail -n 1
}

running() {  # a live process (an exited one awaiting its reaper, a zombie, does not count)
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "${state#Z}" = "$state" ]
}

descendants() {  # the given PIDs and every process below them (raylet, GCS, workers, ...)
  local all="$*" next
  next=$(ps -eo pid=,ppid= | awk -v p=" $* " 'index(p, " " $2 " ") {print $1}')
  [ -n "$next" ] && all="$all $(descendants $next)"
  echo "$all"
}

wait_gone() {  # $1 seconds: until none of the remaining arguments is running
  local limit=$1; shift
  for _ in $(seq 1 "$limit"); do
    local alive=0
    for pid in "$@"; do running "$pid" && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 1
  done
  return 1
}

free_port() {  # a free TCP port on loopback (Ray's agent and client ports have fixed defaults)
  python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

detached() {  # COMMAND... -- LOG: run COMMAND in a session of its own, its PID appended to DIR/pids
  # A node must outlive the terminal that started it: closing a pseudo-terminal (ssh -t, a CI step, a tmux
  # pane) sends SIGHUP to its session, so each node gets a new session (setsid, no controlling terminal)
  # and reads nothing from it (a background job of this non-interactive script leads no process group, so
  # setsid runs the node in place and $! is the node's PID). The log is created here, before the node
  # starts, so that wait_started only ever reads what this node writes.
  local args=() log
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  log=$2
  : > "$log"
  setsid "${args[@]}" < /dev/null >> "$log" 2>&1 &
  echo $! >> "$dir/pids"
}

said=$SECONDS
say() {  # a line of `start`'s progress; `wait_started` says another where none came for SILENT_S seconds
  echo "$*"
  said=$SECONDS
}
SILENT_S=8  # under the 10 s no wait may pass in silence: SECONDS counts whole seconds

wait_started() {  # $1 pid, $2 log: until the node reports it started; fail fast if it died
  local from=$SECONDS
  for _ in $(seq 1 120); do
    grep -q "Ray runtime started" "$2" 2>/dev/null && return 0
    [ $((SECONDS - said)) -ge "$SILENT_S" ] && say "  still starting after $((SECONDS - from)) s (see $2)"
    if ! running "$1"; then
      echo "a Ray node failed to start; the end of $2:" >&2
      tail -n 15 "$2" >&2
      return 1
    fi
    sleep 1
  done
  echo "a Ray node did not start within 120 s; see $2" >&2
  return 1
}

case "$cmd" in
  start)
    if [ -s "$dir/pids" ]; then echo "a cluster started from $dir may be running; stop it first" >&2; exit 1; fi
    if [ ${#dir} -gt 40 ]; then  # Ray's socket paths below DIR/ray must stay under 107 bytes
      echo "--dir $dir is too long for Ray's socket paths; use one of at most 40 characters" >&2
      exit 2
    fi
    began=$SECONDS  # the line comes first: clearing an earlier cluster's session files may itself take seconds
    say "starting the head node (GCS 127.0.0.1:$port, dashboard 127.0.0.1:$dashboard_port); its log: $dir/head.log"
    mkdir -p "$dir"
    rm -rf "$dir/ray" "$dir"/w[0-9]*  # a previous cluster's session files would make the new nodes fail to join
    python -c 'import secrets; print(secrets.token_hex(32))' > "$dir/auth_token"
    chmod 600 "$dir/auth_token"
    echo "$dashboard_port" > "$dir/dashboard_port"
    echo "$port" > "$dir/port"
    export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$dir/auth_token" RAY_USAGE_STATS_ENABLED=0
    export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}
    echo "$RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S" > "$dir/drain_s"  # read by `stop`
    # A RAY_ADDRESS left in the shell (say by an earlier `eval "$(local_cluster.sh env)"`) makes the worker
    # nodes fail to join this head while the head itself comes up: the nodes get their addresses only here.
    unset RAY_ADDRESS DSCORE_RAY_ADDRESS
    rm -f "$dir"/*.log  # an earlier cluster's logs (one with more workers, say) would mislead whoever reads them
    detached ray start --head --block --node-ip-address 127.0.0.1 --port "$port" --num-cpus "$cpus" \
      --include-dashboard true --dashboard-host 127.0.0.1 --dashboard-port "$dashboard_port" \
      --dashboard-agent-listen-port "$(free_port)" --ray-client-server-port "$(free_port)" \
      --temp-dir "$dir/ray" --disable-usage-stats -- "$dir/head.log"
    wait_started "$(tail -n 1 "$dir/pids")" "$dir/head.log" || { "$0" stop --dir "$dir"; exit 1; }
    for i in $(seq 1 "$workers"); do
      # Each worker node has a session folder of its own (DIR/wN; no longer than DIR/ray, for the socket
      # paths). Sharing the head's, every node's runtime-env agent unpacked a job's working_dir into the same
      # folder, deleting it first (Ray 2.60 unpacks with overwrite): a job's driver on the head lost its
      # current directory as its actors started on a worker node, and concurrent jobs failed.
      say "starting worker node $i of $workers; its log: $dir/worker-$i.log"
      detached ray start --block --address "127.0.0.1:$port" --node-ip-address 127.0.0.1 --num-cpus "$cpus" \
        --dashboard-agent-listen-port "$(free_port)" --temp-dir "$dir/w$i" --disable-usage-stats -- "$dir/worker-$i.log"
      wait_started "$(tail -n 1 "$dir/pids")" "$dir/worker-$i.log" || { "$0" stop --dir "$dir"; exit 1; }
    done
    say "checking that all $((workers + 1)) nodes have joined"
    joined=$(alive_nodes)
    if [ "$joined" != "$((workers + 1))" ]; then
      echo "only ${joined:-0} of $((workers + 1)) Ray nodes are alive (see $dir/*.log); stopping. Another Ray on" \
        "port $port, or stale files in $dir, can cause this: pick another --port or --dir and start again" >&2
      "$0" stop --dir "$dir" >&2
      exit 1
    fi
    echo "local Ray cluster up: 1 head + $workers workers, $cpus CPUs each, dashboard at" \
      "http://127.0.0.1:$dashboard_port ($((SECONDS - began)) s). To use it:"
    print_env
    ;;
  env)
    print_env
    ;;
  status)
    [ -s "$dir/pids" ] || { echo "no cluster started from $dir" >&2; exit 1; }
    nodes=$(wc -w < "$dir/pids")
    alive=$(alive_nodes)
    echo "${alive:-0} of $nodes Ray nodes alive"
    [ "${alive:-0}" = "$nodes" ]
    ;;
  stop)
    [ -f "$dir/pids" ] || { echo "no cluster started from $dir" >&2; exit 0; }
    started=$(cat "$dir/pids")
    drain=$(cat "$dir/drain_s" 2>/dev/null || echo 30)  # a cluster started before drain_s was kept: Ray's default
    drain=${drain%.*}
    # shellcheck disable=SC2086
    all=$(descendants $started)  # noted before any exits, so that no child is orphaned unnoticed
    if [ "${drain:-0}" -gt 0 ]; then
      echo "stopping the $(echo $started | wc -w) Ray nodes started from $dir: each drains first (Ray's" \
        "graceful shutdown), for up to $drain s"
    else
      echo "stopping the $(echo $started | wc -w) Ray nodes started from $dir"
    fi
    began=$SECONDS
    for pid in $started; do kill -TERM "$pid" 2>/dev/null || true; done
    # shellcheck disable=SC2086
    if ! wait_gone $((${drain:-0} + 30)) $all; then  # a node that ignored SIGTERM: end it and everything below it
      for pid in $all; do running "$pid" && kill -KILL "$pid" 2>/dev/null; done
      # shellcheck disable=SC2086
      wait_gone 10 $all || { echo "processes of the cluster still run: $all" >&2; exit 1; }
    fi
    rm -f "$dir/pids"
    echo "stopped the cluster started from $dir ($((SECONDS - began)) s)"
    ;;
  *)
    sed -n '2,19p' "$0" >&2
    exit 2
    ;;
esac
