"""The scale harness's tables (Markdown, for RESULTS.md) and its log-log plot, from the journal's records.

Every table row carries the 1-minute load average at the start and end of its measurement, so a figure
taken while other work ran can be told apart.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

KIB_PER_MIB = 1024


def mib(kb: float | None) -> str:
    return "-" if kb is None else f"{kb / KIB_PER_MIB:,.0f}"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def load(record: dict) -> str:
    return f"{record['load_start'][0]:.1f} / {record['load_end'][0]:.1f}"


def ordered(records: list[dict], kinds: tuple[str, ...]) -> list[dict]:
    """The records of `kinds` in a stable order: kind, scorer, mode, size."""
    modes = {"in-process": 0, "ray-1": 1, "ray-2": 2}
    chosen = [r for r in records if r["spec"]["kind"] in kinds]
    return sorted(
        chosen,
        key=lambda r: (
            kinds.index(r["spec"]["kind"]),
            r["spec"]["scorer"],
            modes.get(r["spec"]["mode"], 9),
            r["spec"]["n"],
        ),
    )


def not_ok(record: dict, columns: int) -> str | None:
    """`columns` cells (the reason, then empty ones) for a measurement that did not finish, or None."""
    if record["status"] == "ok":
        return None
    why = {
        "timeout": f"timed out after {record['timeout_s']:.0f} s",
        "failed": "failed (see scale.json)",
        "skipped": record.get("result", {}).get("skipped", "skipped"),
    }[record["status"]]
    return why + " |" * columns


def run_table(records: list[dict]) -> list[str]:
    lines = [
        "| scorer | execution | rows | seconds | rows/s | ms/row | first shard s | rows/s after it | summary s "
        "| driver peak MiB (at start) | scoring actor MiB | tokenising actor MiB | files | MB written "
        "| load start / end |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for rec in ordered(records, ("run",)):
        s = rec["spec"]
        head = f"| {s['scorer']} | {s['mode']} | {s['n']:,} | "
        missing = not_ok(rec, 11)
        if missing:
            lines.append(head + missing + f" {load(rec)} |")
            continue
        r = rec["result"]
        actors = r["actor_peak_rss_kb"]
        steady = steady_rows_per_s(r)
        lines.append(
            head + f"{seconds(r['total_s'])} | {r['rows_per_s']:,.0f} | {1000 / r['rows_per_s']:.3f} | "
            f"{seconds(r['first_marker_s'])} | {'-' if steady is None else f'{steady:,.0f}'} | "
            f"{seconds(r['summary_s'])} | {mib(r['driver_peak_rss_kb'])} "
            f"({mib(r['driver_rss_start_kb'])}) | {mib(actors.get('score'))} | {mib(actors.get('prepare'))} | "
            f"{r['files_written']:,} | {r['bytes_written'] / 1e6:,.1f} | {load(rec)} |"
        )
    return lines


def steady_rows_per_s(result: dict) -> float | None:
    """Rows per second once the first shard is done: the run's rate without its fixed start (Ray's actors
    starting, a model loading), which is what grows with N; None with a single shard."""
    rows, shards = result["todo_rows"], result["todo_shards"]
    if shards < 2 or result["first_marker_s"] is None:
        return None
    after = result["claim_s"] + result["execute_s"] - result["first_marker_s"]
    return rows * (shards - 1) / shards / after if after > 0 else None


def resume_table(records: list[dict]) -> list[str]:
    lines = [
        "| execution | rows | shards | killed after s | shards done at kill | rerun start-up s | rerun claim s "
        "| rerun first new shard s (after start-up) | rerun total s | rerun driver peak MiB | load start / end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for rec in ordered(records, ("resume",)):
        s = rec["spec"]
        head = f"| {s['mode']} | {s['n']:,} | "
        missing = not_ok(rec, 8)
        if missing:
            lines.append(head + missing + f" {load(rec)} |")
            continue
        r, rerun = rec["result"], rec["result"]["rerun"]
        lines.append(
            head + f"{r['shards']:,} | {seconds(r['killed_after_s'])} | {r['marked_at_kill']:,} | "
            f"{seconds(rerun['startup_s'])} | {seconds(rerun['claim_s'])} | {seconds(rerun['first_marker_s'])} | "
            f"{seconds(rerun['total_s'])} | {mib(rerun['driver_peak_rss_kb'])} | {load(rec)} |"
        )
    return lines


def audit_table(records: list[dict]) -> list[str]:
    lines = [
        "| rows | partitions | scoring s | audit s | audit with baseline s | report.html kB | audit.json kB "
        "| outliers | driver peak MiB (at start) | load start / end |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for rec in ordered(records, ("audit",)):
        head = f"| {rec['spec']['n']:,} | "
        missing = not_ok(rec, 8)
        if missing:
            lines.append(head + missing + f" {load(rec)} |")
            continue
        r = rec["result"]
        lines.append(
            head + f"{r['partitions']} | {seconds(r['scoring']['total_s'])} | {seconds(r['audit_s'])} | "
            f"{seconds(r['audit_baseline_s'])} | {r['report_bytes'] / 1e3:,.0f} | {r['audit_json_bytes'] / 1e3:,.0f} | "
            f"{r['outliers']:,} | {mib(r['driver_peak_rss_kb'])} ({mib(r['driver_rss_start_kb'])}) | {load(rec)} |"
        )
    return lines


def rescore_table(records: list[dict]) -> list[str]:
    lines = [
        "| hypotheses | utterances | unique texts | read + dedupe s | scoring s | join s | tuning s | write s "
        "| after scoring s | lambda points | driver peak MiB (before tuning) | load start / end |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for rec in ordered(records, ("rescore",)):
        head = f"| {rec['spec']['n']:,} | "
        missing = not_ok(rec, 10)
        if missing:
            lines.append(head + missing + f" {load(rec)} |")
            continue
        r = rec["result"]
        lines.append(
            head + f"{r['utterances']:,} | {r['unique_texts']:,} | {seconds(r['read_dedupe_s'])} | "
            f"{seconds(r['scoring_s'])} | {seconds(r['join_s'])} | {seconds(r['tuning_s'])} | {seconds(r['write_s'])} "
            f"| {seconds(r['after_scoring_s'])} | {r['grid_points']} | {mib(r['driver_peak_rss_kb'])} "
            f"({mib(r['driver_rss_before_tuning_kb'])}) | {load(rec)} |"
        )
    return lines


def inputs_table(records: list[dict]) -> list[str]:
    lines = [
        "| input | execution | files | rows | MB in | claim s | seconds | rows/s | MB/s | driver peak MiB "
        "| files written | load start / end |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for rec in ordered(records, ("many-files", "large-file")):
        s = rec["spec"]
        head = f"| {s['kind']} | {s['mode']} | {s['files']:,} | {s['n']:,} | "
        missing = not_ok(rec, 7)
        if missing:
            lines.append(head + missing + f" {load(rec)} |")
            continue
        r = rec["result"]
        size = r.get("input_bytes")
        megabytes = "-" if size is None else f"{size / 1e6:,.0f}"
        rate = "-" if size is None else f"{size / 1e6 / r['total_s']:,.1f}"
        lines.append(
            head + f"{megabytes} | {seconds(r['claim_s'])} | {seconds(r['total_s'])} | {r['rows_per_s']:,.0f} | "
            f"{rate} | {mib(r['driver_peak_rss_kb'])} | {r['files_written']:,} | {load(rec)} |"
        )
    return lines


def machine_line(info: dict) -> str:
    v = info["versions"]
    return (
        f"{info['cpu']}, {info['logical_cores']} logical cores; python {info['python']}, "
        + ", ".join(f"{name} {version}" for name, version in v.items() if version)
        + "."
    )


def markdown(records: list[dict], info: dict, image: str | None = None) -> str:
    """All tables, each under a line that says what it measures; `image` links the plot."""
    threads = sorted({r["settings"]["threads"] for r in records if "settings" in r})
    machines = {machine_line(r["machine"]) for r in records if "machine" in r} or {machine_line(info)}
    parts = [
        *sorted(machines),
        f"Torch threads of in-process model runs: {', '.join(map(str, threads))}; shards of "
        f"{', '.join(sorted({str(r['settings']['shard_rows']) for r in records}))} rows. Load: the 1-minute "
        "load average at the start and end of each measurement.",
        "",
    ]
    if image:
        parts += [f"![seconds and peak memory against rows]({image})", ""]
    sections = (
        ("Runs (`run`): plan and claim, execute, summary.json", run_table),
        ("Resume after a SIGKILL at half way (`resume`, no-op scorer)", resume_table),
        ("`dscore audit` after scoring (`audit`: statistics, outliers, report; then against a baseline)", audit_table),
        ("`dscore rescore`'s steps (`rescore`, 10 hypotheses per utterance, no-op scores)", rescore_table),
        ("Inputs: many small files, one large file (`many-files`, `large-file`, no-op scorer)", inputs_table),
    )
    for title, table in sections:
        rows = table(records)
        if len(rows) > 2:
            parts += [f"**{title}**", "", *rows, ""]
    return "\n".join(parts)


def curves(records: list[dict]) -> tuple[dict, dict]:
    """{line label: [(rows, seconds)]} and {line label: [(rows, peak MiB)]}, finished measurements only."""
    time_lines: dict[str, list] = defaultdict(list)
    memory_lines: dict[str, list] = defaultdict(list)
    for rec in records:
        if rec["status"] != "ok":
            continue
        s, r = rec["spec"], rec["result"]
        if s["kind"] == "run":
            name = f"{s['scorer']}, {s['mode']}"
            time_lines[name].append((s["n"], r["total_s"]))
            memory_lines[f"driver: {name}"].append((s["n"], r["driver_peak_rss_kb"] / KIB_PER_MIB))
            if "score" in r["actor_peak_rss_kb"]:
                memory_lines[f"scoring actor: {name}"].append((s["n"], r["actor_peak_rss_kb"]["score"] / KIB_PER_MIB))
        elif s["kind"] == "resume":
            time_lines[f"resume to first new shard, {s['mode']}"].append((s["n"], r["rerun"]["first_marker_s"]))
        elif s["kind"] == "audit":
            time_lines["audit after scoring"].append((s["n"], r["audit_s"]))
            memory_lines["driver: audit"].append((s["n"], r["driver_peak_rss_kb"] / KIB_PER_MIB))
        elif s["kind"] == "rescore":
            time_lines["rescore after scoring"].append((s["n"], r["after_scoring_s"]))
            memory_lines["driver: rescore"].append((s["n"], r["driver_peak_rss_kb"] / KIB_PER_MIB))
    return time_lines, memory_lines


def plot(records: list[dict], path: Path) -> Path | None:
    """Seconds and peak RSS against rows, log-log, one line per scorer and execution; None when nothing
    finished."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    time_lines, memory_lines = curves(records)
    if not time_lines:
        return None
    figure = Figure(figsize=(13, 5.2))
    FigureCanvasAgg(figure)
    for axis, lines, ylabel in zip(figure.subplots(1, 2), (time_lines, memory_lines), ("seconds", "peak RSS (MiB)")):
        axis.set_prop_cycle(color=colormaps["tab20"].colors)  # more lines than the default 10 colours
        for name, points in sorted(lines.items()):
            shown = sorted(p for p in points if p[1] is not None and p[1] > 0)  # log axes: no zero, no missing
            if shown:
                xs, ys = zip(*shown)
                axis.plot(xs, ys, "--" if name.startswith("scoring actor") else "-", marker="o", label=name)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("rows (hypotheses for rescore)")
        axis.set_ylabel(ylabel)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path
