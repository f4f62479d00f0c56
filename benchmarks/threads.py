"""The thread cliff: a tiny model's forward against intra-op threads and busy cores.

    python benchmarks/threads.py --quick --out /tmp/threads                   # checks every path
    python benchmarks/threads.py --update-results benchmarks/RESULTS.md       # on a quiet machine

On a machine whose cores are busy, a torch op run with more intra-op threads than there are free cores
can take 10-50 times as long: the threads wait for each other at every op. This measures it. Each
configuration runs in a fresh process (OpenMP reads its settings when torch starts) while this harness
keeps 0, 1 or 2 cores busy with spinning processes it starts and stops:

  grid         intra-op threads 1, 2, 4 (torch.set_num_threads) x busy cores 0, 1, 2, in the process
               itself and inside a Ray actor (an embedded Ray; the actor asks for min(threads, cores)
               CPUs, as the scoring actors are sized);
  wait policy  OMP_WAIT_POLICY passive and active (unset in the grid) with 2 threads, in the process;
  interop      torch.set_num_interop_threads(1) with 2 threads, in the process.

Measured, after a warm-up: the median wall time of the forward pass of the tiny model (BERT 2x64,
V = 1,000, random weights, full logits) on 40 sentences x 25 tokens (about the CPU engine's 1,024-token
budget), that time per ATen op (the forward's top-level ops, counted once with torch.profiler), and
the median time of one small op alone (linear, (1000, 64) x (64, 64)). Each configuration repeats for
about --seconds seconds (at least 5 forwards). Like scale.py, every finished configuration is a line
of OUT/threads.jsonl that a rerun skips; OUT/threads.json and OUT/threads.md are written at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness import append_journal, duration, is_finished, kill_tree, last_line, load_journal, spawn, wait_child

SCRIPT = Path(__file__).resolve()
THREADS = (1, 2, 4)
BUSY = (0, 1, 2)
WHERE = ("in-process", "ray-actor")
BATCH = (40, 25)  # sentences x tokens of one forward
LINEAR = (1000, 64)  # rows x features of the small op
MIN_REPEATS = 5
START_S, RAY_START_S = 8.0, 15.0  # a configuration's process start, model load and warm-up; Ray's start (estimate)


@dataclass(frozen=True)
class Config:
    """One measurement: where the forward runs, its intra-op threads, busy cores around it, and the
    OpenMP wait policy and inter-op threads (None: torch's default)."""

    where: str
    threads: int
    busy: int
    wait_policy: str | None = None
    interop: int | None = None

    @property
    def key(self) -> str:
        return f"{self.where}/{self.threads}t/{self.busy}busy/{self.wait_policy or '-'}/{self.interop or '-'}"


def plan(threads: tuple[int, ...], busy: tuple[int, ...], where: tuple[str, ...]) -> list[Config]:
    """The grid, then the wait policies and a single inter-op thread at 2 intra-op threads in the process."""
    configs = [Config(w, t, b) for w in where for t in threads for b in busy]
    if "in-process" in where:
        configs += [Config("in-process", 2, b, policy) for policy in ("passive", "active") for b in busy]
        configs += [Config("in-process", 2, b, interop=1) for b in busy]
    return configs


# ---------------------------------------------------------------------------------------------------
# In the measuring process (or its Ray actor).


def time_forward(model_dir: str, threads: int, interop: int | None, seconds: float) -> dict:
    """Median seconds of the forward and of the small op, the forward's op count, and what torch runs with."""
    import torch

    from distributed_scoring.config import ModelSpec
    from distributed_scoring.engine.masked_lm import load_masked_lm

    if interop is not None:
        torch.set_num_interop_threads(interop)  # before any parallel work, or torch refuses
    torch.set_num_threads(threads)
    model = load_masked_lm(ModelSpec(model_dir, device="cpu", dtype="float32")).model
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, BATCH, generator=generator)  # (B, T)
    x = torch.randn(LINEAR, generator=generator)  # (R, H)
    weight, bias = torch.randn(LINEAR[1], LINEAR[1], generator=generator), torch.randn(LINEAR[1], generator=generator)
    with torch.inference_mode():
        forward = repeat(lambda: model(input_ids=ids), seconds)
        linear = repeat(lambda: torch.nn.functional.linear(x, weight, bias), seconds / 4)
        ops = count_ops(lambda: model(input_ids=ids))
    return {
        "forward_s": statistics.median(forward),
        "forward_p90_s": quantile(forward, 0.9),
        "forwards": len(forward),
        "linear_s": statistics.median(linear),
        "ops": ops,
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "pid": os.getpid(),
    }


def repeat(call, seconds: float) -> list[float]:
    """Seconds of each call, after three warm-up calls, for about `seconds` (at least MIN_REPEATS calls)."""
    for _ in range(3):
        call()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < MIN_REPEATS or time.perf_counter() < deadline:
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def count_ops(call) -> int:
    """The top-level ATen ops of one call (ops called by other ATen ops are inside them, not counted)."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        call()
    return sum(
        1
        for e in profile.events()
        if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    )


def measure(config: Config, model_dir: str, seconds: float) -> dict:
    """`time_forward` here, or in a Ray actor of min(threads, cores) CPUs on an embedded Ray."""
    if config.where == "in-process":
        return time_forward(model_dir, config.threads, config.interop, seconds)
    import ray

    from distributed_scoring.pipeline.cluster import LOCAL_SPARE_CPUS

    cores = os.cpu_count() or 1
    ray.init(num_cpus=cores + LOCAL_SPARE_CPUS, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    env = {"OMP_WAIT_POLICY": config.wait_policy} if config.wait_policy else {}
    remote = ray.remote(num_cpus=min(config.threads, cores), runtime_env={"env_vars": env})(time_forward)
    try:
        return {
            **ray.get(remote.remote(model_dir, config.threads, config.interop, seconds)),
            "actor_cpus": min(config.threads, cores),
        }
    finally:
        ray.shutdown()


# ---------------------------------------------------------------------------------------------------
# The harness.


def busy_cores(count: int) -> list[subprocess.Popen]:
    """`count` processes that spin until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(count)]


def run_config(config: Config, model_dir: str, seconds: float, timeout_s: float, work: Path, info: dict) -> dict:
    """One configuration in a child process, with its busy cores spinning around it; its journal record."""
    log = work / f"{config.key.replace('/', '_')}.log"
    log.write_text("")
    result = work / "result.json"
    result.unlink(missing_ok=True)
    spinners = busy_cores(config.busy)
    try:
        time.sleep(0.5)  # let the spinners take their cores
        load_start, started = os.getloadavg(), time.perf_counter()
        when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        env = {"OMP_NUM_THREADS": str(config.threads), "MKL_NUM_THREADS": str(config.threads)}
        if config.wait_policy:
            env["OMP_WAIT_POLICY"] = config.wait_policy
        process = spawn(
            SCRIPT,
            [
                "--measure",
                json.dumps(asdict(config)),
                "--model-dir",
                model_dir,
                "--seconds",
                str(seconds),
                "--result",
                str(result),
            ],
            log,
            env,
        )
        status = wait_child(process, timeout_s, log, config.key)
        record = {
            "key": config.key,
            "config": asdict(config),
            "started": when,
            "status": status,
            "timeout_s": timeout_s,
            "wall_s": time.perf_counter() - started,
            "load_start": load_start,
            "load_end": os.getloadavg(),
            "machine": info,
        }
    finally:
        for spinner in spinners:
            kill_tree(spinner.pid)
    if status == "ok":
        record["result"] = json.loads(result.read_text())
    else:
        record["log_tail"] = last_line(log)
    return record


def cell(record: dict | None) -> str:
    """`forward ms (µs per op)`, or why there is none."""
    if record is None:
        return "-"
    if record["status"] != "ok":
        return record["status"]
    r = record["result"]
    return f"{r['forward_s'] * 1e3:.1f} ({r['forward_s'] / r['ops'] * 1e6:.0f})"


def markdown(records: list[dict], info: dict) -> str:
    """One row per (where, policy, inter-op, threads): forward and small-op times at each busy count."""
    by_key = {r["key"]: r for r in records}
    rows = sorted(
        {
            (
                r["config"]["where"],
                r["config"]["wait_policy"] or "",
                r["config"]["interop"] or 0,
                r["config"]["threads"],
            )
            for r in records
        }
    )
    busy = sorted({r["config"]["busy"] for r in records})
    v = info["versions"]
    lines = [
        f"{info['cpu']}, {info['logical_cores']} logical cores; python {info['python']}, torch {v['torch']}. "
        f"BERT 2x64, V = 1,000, forward on {BATCH[0]} x {BATCH[1]} tokens; median over about "
        f"{records[0]['result']['forwards'] if records and records[0]['status'] == 'ok' else '?'} forwards. "
        "Cells: forward ms (µs per top-level ATen op) | small linear µs. Load: 1-minute load average, "
        "lowest start and highest end of the row's measurements.",
        "",
        "| where | OMP_WAIT_POLICY | inter-op | intra-op threads | "
        + " | ".join(f"forward, {b} busy" for b in busy)
        + " | "
        + " | ".join(f"linear µs, {b} busy" for b in busy)
        + " | load |",
        "|---|---|---:|---:|" + "---:|" * (2 * len(busy)) + "---|",
    ]
    for where, policy, interop, threads in rows:
        found = [by_key.get(Config(where, threads, b, policy or None, interop or None).key) for b in busy]
        linear = [f"{r['result']['linear_s'] * 1e6:.0f}" if r and r["status"] == "ok" else "-" for r in found]
        measured = [r for r in found if r]
        load = (
            f"{min(r['load_start'][0] for r in measured):.1f} / {max(r['load_end'][0] for r in measured):.1f}"
            if measured
            else "-"
        )
        lines.append(
            f"| {where} | {policy or 'unset'} | {interop or 'default'} | {threads} | "
            + " | ".join(cell(r) for r in found)
            + " | "
            + " | ".join(linear)
            + f" | {load} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    if args.measure:
        config = Config(**json.loads(args.measure))
        Path(args.result).write_text(json.dumps(measure(config, args.model_dir, args.seconds)))
        return
    from distributed_scoring.offline.models import cache_root

    import machine
    import results_md
    from joints_speed import tiny_bert

    out = args.out.resolve()
    work = out / "threads-logs"
    work.mkdir(parents=True, exist_ok=True)
    journal_path = out / "threads.jsonl"
    journal = load_journal(journal_path)
    model_dir = str(tiny_bert(args.models_dir or cache_root() / "bench-models"))
    info = machine.describe()
    configs = plan(args.threads, args.busy, args.where)
    todo = [c for c in configs if not is_finished(journal.get(c.key), args.timeout)]
    estimate = sum(args.seconds * 1.5 + (START_S + RAY_START_S if c.where == "ray-actor" else START_S) for c in todo)
    print(
        f"{len(configs)} configurations, {len(configs) - len(todo)} already in {journal_path}; {len(todo)} to run, "
        f"about {duration(estimate)} on quiet cores; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    for i, config in enumerate(todo):
        print(f"[{i + 1}/{len(todo)}] {config.key}", flush=True)
        record = run_config(config, model_dir, args.seconds, args.timeout, work, info)
        append_journal(journal_path, record)
        journal[config.key] = record
        print(
            f"      {cell(record)} ({duration(record['wall_s'])}; load {record['load_start'][0]:.1f} -> "
            f"{record['load_end'][0]:.1f})",
            flush=True,
        )
    records = list(journal.values())
    (out / "threads.json").write_text(json.dumps({"machine": info, "measurements": records}, indent=1))
    table = markdown(records, info)
    (out / "threads.md").write_text(table)
    print(table)
    if args.update_results:
        results_md.update_section(args.update_results, "threads", table, "benchmarks/threads.py")


def _ints(value: str) -> tuple[int, ...]:
    return tuple(int(v) for v in value.split(",") if v)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=_ints, default=THREADS, help="intra-op threads (comma-separated)")
    parser.add_argument("--busy", type=_ints, default=BUSY, help="busy cores (comma-separated)")
    parser.add_argument("--where", type=lambda v: tuple(v.split(",")), default=WHERE, help="in-process,ray-actor")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each configuration repeats")
    parser.add_argument("--quick", action="store_true", help="1 second per configuration (checks every path)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    parser.add_argument(
        "--models-dir", type=Path, help="where the tiny model is saved (default: the cache's bench-models)"
    )
    parser.add_argument("--out", type=Path, default=SCRIPT.parent / "results", help="threads.jsonl/.json/.md go here")
    parser.add_argument("--update-results", type=Path, help="also write the table into this RESULTS.md")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.seconds = 1.0
    return args


if __name__ == "__main__":
    main()
