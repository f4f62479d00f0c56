"""The run layer's cost against corpus size, 10^3 to 10^6 rows: time, memory, files, resume.

    python benchmarks/scale.py --quick --out /tmp/scale        # 10^3 and 10^4 rows: checks every path
    python benchmarks/scale.py --update-results benchmarks/RESULTS.md    # full sizes, on a quiet machine

Measurements, each in a process of its own (so that its peak memory is its own):

  run         a synthetic corpus (BLiMP-like sentences, one per line, shards of --shard-rows) through
              `pipeline.runner` (plan and claim the folder, execute, summarize), as `dscore score` runs it,
              with the no-op scorer (`scale_stages.noop_workload`: the PLL's columns, zero scores, no
              model: the run layer's own cost) and with a tiny model (BERT 2x64, V = 1,000, random
              weights; up to --model-max rows) scored three ways: the PLL (`tiny`), one pass of the
              unmasked sentence (`tiny-unmasked`, `--method unmasked`) and a `sentence` maskless student
              of it (`tiny-student`, `--maskless`), in this process and on an embedded Ray with 1 and 2
              scoring actors. Measured: rows/s, time to the first finished shard (its marker), rows/s
              after it (without the fixed start), aggregation (summary.json), driver peak RSS, scoring
              and tokenising actors' peak RSS (each actor records its own), files and bytes written.
  resume      the no-op run started in a subprocess, held once it has scored half its shards
              (`scale_stages.Holding`: where it stops does not depend on how soon a busy harness looks)
              and SIGKILLed (its whole process tree, Ray's included) once their markers are written, then
              rerun: the rerun's start-up, its claim (planning, checking the done shards' markers and
              files) and the time until its first new marker appears.
  audit       no-op rows with pseudo-random scores (`--scores hash`: outliers exist) and per-token
              columns in 10 partitions, scored in a subprocess; then `workflows.audit.run_audit` in
              this process as `dscore audit` runs it after scoring (statistics, outliers, report), and
              again against the first audit as baseline (bootstrap or delta-method intervals).
  rescore     N-best lists of N hypotheses (N / 10 utterances x 10, half dev, half test) through the
              steps of `dscore rescore` (workflows/rescore/run.py): read and dedupe, write the texts,
              score them (the no-op scorer with pseudo-random scores: `dscore rescore` takes no
              workload, and a tiny model would take hours at 10^6 hypotheses), join the scores back
              by text, tune on dev (grid search) and apply to test, write the outputs.
  many-files  --many-files small files (10 lines each) as one input folder, in this process and on Ray
              with 2 actors.
  large-file  one file of --large-gb GB (512-byte lines), generated into the measurement's scratch
              folder and deleted after (skipped when the disk lacks room for it and its output).

Each measurement appends a JSON line to OUT/scale.jsonl (the machine, the load average at its start and
end, its figures); a rerun of the command skips the finished ones (a timed-out one is tried again only
under a longer --timeout; a failed one always), so a long run can be stopped and continued. At the end
OUT/scale.json, OUT/scale.md and OUT/scale.png are written from every line of the journal, and with
--update-results the tables go into RESULTS.md. Corpora are cached in WORK/corpora (--work), each
measurement's output in WORK/scratch (deleted after it), its log in WORK/logs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from harness import append_journal, duration, is_finished, kill_tree, last_line, load_journal, spawn, wait_child

SCRIPT = Path(__file__).resolve()

SIZES = (10**3, 10**4, 10**5, 10**6)
QUICK_SIZES = (10**3, 10**4)
MODES = ("in-process", "ray-1", "ray-2")
SCORERS = ("noop", "tiny", "tiny-unmasked", "tiny-student")  # see RUNS
MODEL_SCORERS = SCORERS[1:]  # those that run the tiny model (up to --model-max rows)
KINDS = ("run", "resume", "audit", "rescore", "many-files", "large-file")
MODEL_MAX = 10**5  # the tiny model's largest corpus by default: 10^6 rows take hours on 2 cores
HYPOTHESES_PER_UTTERANCE = 10
AUDIT_PARTITIONS = 10
ROWS_PER_SMALL_FILE = 10
LARGE_LINE_BYTES = 512  # newline included
MIN_SHARDS_TO_RESUME = 4  # fewer shards leave no half way to kill at
POLL_S = 0.02  # how often markers are counted to kill a held run at half way

# The estimate printed at the start: (seconds fixed, microseconds per row), rough guesses for 2 quiet cores
# (the development machine was too busy to calibrate them); the journal's own wall times replace them
# once a measurement of the same kind, scorer and execution has finished.
DEFAULT_COST = {
    ("run", "noop", "in-process"): (3.0, 150.0),
    ("run", "noop", "ray"): (25.0, 400.0),
    ("run", "tiny", "in-process"): (10.0, 12000.0),
    ("run", "tiny", "ray"): (30.0, 15000.0),
    ("run", "tiny-unmasked", "in-process"): (10.0, 1000.0),
    ("run", "tiny-unmasked", "ray"): (30.0, 1500.0),
    ("run", "tiny-student", "in-process"): (10.0, 1000.0),
    ("run", "tiny-student", "ray"): (30.0, 1500.0),
    ("resume", "noop", "in-process"): (6.0, 250.0),
    ("resume", "noop", "ray"): (50.0, 700.0),
    ("audit", "noop", "in-process"): (10.0, 500.0),
    ("rescore", "noop", "in-process"): (10.0, 800.0),
    ("many-files", "noop", "in-process"): (5.0, 3000.0),
    ("many-files", "noop", "ray"): (30.0, 6000.0),
    ("large-file", "noop", "in-process"): (10.0, 200.0),
}
CORPUS_US_PER_ROW = 60.0  # drawing synthetic sentences, once per size (cached)
WRITE_BYTES_PER_S = 100e6  # writing the large file

# ---------------------------------------------------------------------------------------------------
# What is measured.


@dataclass(frozen=True)
class Spec:
    """One measurement: `n` rows (hypotheses for rescore), in `files` input files."""

    kind: str
    scorer: str
    mode: str
    n: int
    files: int = 1

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.scorer}/{self.mode}/{self.n}" + (f"/{self.files}-files" if self.files > 1 else "")

    @property
    def label(self) -> str:
        what = f"{self.n:,} {'hypotheses' if self.kind == 'rescore' else 'rows'}"
        files = f" in {self.files:,} files" if self.files > 1 else ""
        return f"{self.kind}: {self.scorer} scorer, {self.mode}, {what}{files}"


@dataclass(frozen=True)
class Settings:
    """What every measurement of one harness run shares."""

    corpora: str  # cached inputs
    threads: int  # torch threads in this process (in-process runs of the tiny model)
    shard_rows: int
    tiny_model: str | None


def plan(
    sizes: Iterable[int],
    scorers: Iterable[str],
    modes: Iterable[str],
    kinds: Iterable[str],
    model_max: int,
    shard_rows: int,
    many_files: int,
    large_gb: float,
) -> list[Spec]:
    """Every measurement asked for, smallest corpora first (so early results predict the later ones)."""
    sizes, scorers, modes, kinds = sorted(sizes), list(scorers), list(modes), set(kinds)
    specs: list[Spec] = []
    for n in sizes:
        if "run" in kinds:
            specs += [Spec("run", s, m, n) for s in scorers if s not in MODEL_SCORERS or n <= model_max for m in modes]
        if "resume" in kinds and n // shard_rows >= MIN_SHARDS_TO_RESUME:
            specs += [Spec("resume", "noop", m, n) for m in modes]
        if "audit" in kinds:
            specs.append(Spec("audit", "noop", "in-process", n))
        if "rescore" in kinds:
            specs.append(Spec("rescore", "noop", "in-process", n))
    if "many-files" in kinds:
        specs += [
            Spec("many-files", "noop", m, many_files * ROWS_PER_SMALL_FILE, many_files) for m in modes if m != "ray-1"
        ]
    if "large-file" in kinds and large_gb > 0:
        specs.append(Spec("large-file", "noop", "in-process", large_file_rows(large_gb)))
    return specs


def large_file_rows(gigabytes: float) -> int:
    return int(gigabytes * 1e9) // LARGE_LINE_BYTES


# ---------------------------------------------------------------------------------------------------
# Time estimate.


def cost_group(spec: Spec) -> tuple[str, str, str]:
    return spec.kind, spec.scorer, "in-process" if spec.mode == "in-process" else "ray"


def estimate_s(spec: Spec, journal: dict[str, dict], corpora: Path) -> float:
    """Seconds the measurement should take: the default cost model, or the largest finished measurement of
    the same kind, scorer and execution scaled linearly in rows beyond the fixed cost; plus drawing its
    corpus when it is not cached yet."""
    fixed, per_row_us = DEFAULT_COST.get(cost_group(spec), (30.0, 1000.0))
    same = [r for r in journal.values() if r["status"] == "ok" and cost_group(Spec(**r["spec"])) == cost_group(spec)]
    if same:
        largest = max(same, key=lambda r: r["spec"]["n"])
        per_row_us = max(largest["wall_s"] - fixed, 0.0) / largest["spec"]["n"] * 1e6
    seconds = fixed + spec.n * per_row_us / 1e6
    if spec.kind == "large-file":
        seconds += spec.n * LARGE_LINE_BYTES / WRITE_BYTES_PER_S
    elif not any(corpora.glob(f"*-{spec.n if spec.files == 1 else spec.files}*")):
        seconds += spec.n * CORPUS_US_PER_ROW / 1e6
    return seconds


# ---------------------------------------------------------------------------------------------------
# Inputs, cached in the corpora folder (written under a temporary name, then renamed).


def cached(path: Path, write) -> Path:
    if not path.exists():
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        write(temporary)
        os.replace(temporary, path)
    return path


def sentence_corpus(corpora: Path, n: int) -> Path:
    """n BLiMP-like sentences, one per line."""
    import synthetic

    return cached(
        corpora / f"sentences-{n}.txt",
        lambda p: p.write_text("\n".join(synthetic.sentences(n, "blimp", seed=11)) + "\n"),
    )


def audit_corpus(corpora: Path, n: int) -> Path:
    """n sentences as JSONL records with a `source` among AUDIT_PARTITIONS partitions."""

    def write(path: Path) -> None:
        lines = sentence_corpus(corpora, n).read_text().splitlines()
        with path.open("w") as f:
            for i, text in enumerate(lines):
                f.write(json.dumps({"text": text, "source": f"source-{i % AUDIT_PARTITIONS}"}) + "\n")

    return cached(corpora / f"audit-{n}.jsonl", write)


def many_files_corpus(corpora: Path, files: int) -> Path:
    """A folder of `files` text files of ROWS_PER_SMALL_FILE sentences each."""

    def write(path: Path) -> None:
        lines = sentence_corpus(corpora, files * ROWS_PER_SMALL_FILE).read_text().splitlines()
        path.mkdir()
        for i in range(files):
            chunk = lines[i * ROWS_PER_SMALL_FILE : (i + 1) * ROWS_PER_SMALL_FILE]
            (path / f"part-{i:06d}.txt").write_text("\n".join(chunk) + "\n")

    return cached(corpora / f"many-{files}", write)


def nbest_lists(corpora: Path, n: int) -> tuple[Path, Path]:
    """dev and test N-best JSONL lists of n hypotheses in all: n / 10 utterances, 10 hypotheses each, every
    hypothesis its reference with k random word edits (k = rank - 1 plus noise), its score falling with k."""

    def write(dev: Path, test: Path) -> None:
        import synthetic

        rng = random.Random(5)
        refs = sentence_corpus(corpora, max(n // HYPOTHESES_PER_UTTERANCE, 2)).read_text().splitlines()
        words = synthetic.lexicon()
        half = len(refs) // 2
        for path, part in ((dev, refs[:half]), (test, refs[half:])):
            with path.open("w") as f:
                for u, ref in enumerate(part):
                    for rank in range(1, HYPOTHESES_PER_UTTERANCE + 1):
                        edits = max(0, rank - 1 + rng.randint(-1, 1))
                        hyp = ref.split()
                        for _ in range(edits):
                            i = rng.randrange(len(hyp))
                            if rng.random() < 0.7 or len(hyp) < 2:
                                hyp[i] = rng.choice(words)
                            else:
                                del hyp[i]
                        record = {
                            "utt_id": f"{path.stem}-{u}",
                            "hyp_id": rank,
                            "text": " ".join(hyp),
                            "score": -2.0 * edits - rng.random(),
                            "ref": ref,
                        }
                        f.write(json.dumps(record) + "\n")

    dev, test = corpora / f"nbest-dev-{n}.jsonl", corpora / f"nbest-test-{n}.jsonl"
    if not (dev.exists() and test.exists()):
        tmp_dev, tmp_test = (p.with_name(f".{p.name}.{os.getpid()}.tmp") for p in (dev, test))
        write(tmp_dev, tmp_test)
        os.replace(tmp_dev, dev)
        os.replace(tmp_test, test)
    return dev, test


def large_file(folder: Path, rows: int) -> Path:
    """`folder/large.txt`: `rows` lines of LARGE_LINE_BYTES bytes (a numbered paragraph of synthetic
    sentences), written in blocks; the caller deletes the folder."""

    def write(path: Path) -> None:
        import synthetic

        pool = synthetic.sentences(20000, "librispeech", seed=3)
        rng = random.Random(3)
        paragraphs = []
        for _ in range(1000):
            text = ""
            while len(text) < LARGE_LINE_BYTES:
                text += rng.choice(pool) + " "
            paragraphs.append(text.encode("ascii", "replace"))
        with path.open("wb", buffering=1 << 24) as f:
            for i in range(rows):
                head = f"{i} ".encode()
                f.write(head + paragraphs[i % len(paragraphs)][: LARGE_LINE_BYTES - 1 - len(head)] + b"\n")

    return cached(folder / "large.txt", write)


def prepare(spec: Spec, corpora: Path, scratch: Path) -> str | None:
    """Write the measurement's inputs before its process starts (drawing them would count in its peak
    memory); the reason to skip it, or None. The large file needs room for itself and its output."""
    if spec.kind == "run" or spec.kind == "resume":
        sentence_corpus(corpora, spec.n)
    elif spec.kind == "audit":
        audit_corpus(corpora, spec.n)
    elif spec.kind == "rescore":
        nbest_lists(corpora, spec.n)
    elif spec.kind == "many-files":
        many_files_corpus(corpora, spec.files)
    elif spec.kind == "large-file":
        needed, free = 2.5 * spec.n * LARGE_LINE_BYTES + 2e9, shutil.disk_usage(scratch).free
        if free < needed:
            return f"{free / 1e9:.1f} GB free, {needed / 1e9:.1f} GB needed for the file and its output"
        large_file(scratch, spec.n)
    return None


# ---------------------------------------------------------------------------------------------------
# One scoring run, timed in parts (in the measuring process).


@dataclass(frozen=True)
class RunJob:
    """One run of the run layer: inputs, the output folder, the scorer, where it runs."""

    paths: tuple[str, ...]
    output: str
    memory: str  # folder where the stages record their peak memory (and, with hold_after, the shards scored)
    scorer: str = "noop"  # noop, or tiny (the PLL workload on `model`)
    model: str | None = None
    mode: str = "in-process"
    shard_rows: int = 1000
    threads: int = 1
    scores: str = "zero"  # the no-op scorer's
    per_token: bool = False
    partition_column: str | None = None
    hold_after: int | None = None  # shards scored before the run holds until killed (`scale_stages.Holding`)


class NewMarkers:
    """A run folder's `_done/` markers as at the start of a run, to tell when the first new one was written
    (from the markers' modification times: exact, and no watching thread competes with the run)."""

    def __init__(self, output: str) -> None:
        self.folder = Path(output) / "_done"
        self.before = self._markers()

    def _markers(self) -> set[tuple[str, int]]:
        try:
            return {(e.name, e.stat().st_mtime_ns) for e in os.scandir(self.folder) if e.name.endswith(".json")}
        except FileNotFoundError:
            return set()

    def first_after(self, started_ns: int) -> float | None:
        """Seconds from `started_ns` (time.time_ns()) to the first marker written since; None if none was."""
        new = [mtime for marker, mtime in self._markers() - self.before]
        return (min(new) - started_ns) / 1e9 if new else None


def start_ray(mode: str):
    """RayOptions for `mode` on an embedded Ray started now (not timed: a cluster is up before a run),
    declaring the cores plus the two spare CPUs `dscore` declares; None in process."""
    if mode == "in-process":
        return None
    import ray

    from distributed_scoring.config import RayOptions
    from distributed_scoring.pipeline.cluster import LOCAL_SPARE_CPUS

    actors = int(mode.removeprefix("ray-"))
    cores = os.cpu_count() or 1
    ray.init(num_cpus=cores + LOCAL_SPARE_CPUS, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    return RayOptions(num_actors=actors, cpus_per_actor=max(1, cores // actors))


def noop_run(job: RunJob, inputs) -> tuple:
    """The no-op workload's config and workload (no model)."""
    from distributed_scoring.config import ModelSpec, RunConfig

    from scale_stages import NOOP_MODEL, NoopOptions, noop_workload

    return RunConfig(inputs, ModelSpec(NOOP_MODEL), output=job.output), noop_workload(
        NoopOptions(job.scores, job.per_token)
    )


def model_config(job: RunJob, inputs, model: str):
    """The RunConfig of a run of `model` on the CPU, as `dscore score` makes it."""
    from distributed_scoring.config import ModelSpec, RunConfig, ScoringOptions

    return RunConfig(inputs, ModelSpec(model, device="cpu"), ScoringOptions(per_token=job.per_token), output=job.output)


def pll_run(job: RunJob, inputs) -> tuple:
    """The PLL workload on `job.model`, its tokenizer loaded first as `dscore score` does."""
    from distributed_scoring.engine.model_files import load_tokenizer
    from distributed_scoring.workloads.pll import pll_workload

    config = model_config(job, inputs, job.model)
    load_tokenizer(config.model)
    return config, pll_workload(config.model, config.scoring)


def unmasked_run(job: RunJob, inputs) -> tuple:
    """`dscore score --method unmasked` on `job.model`: one forward pass of the unmasked sentence."""
    from distributed_scoring.engine.model_files import load_tokenizer
    from distributed_scoring.workloads.maskless import UNMASKED, maskless_workload

    config = model_config(job, inputs, job.model)
    load_tokenizer(config.model)
    return config, maskless_workload(config.model, config.scoring, UNMASKED)


def student_run(job: RunJob, inputs) -> tuple:
    """`dscore score --maskless DIR` with a `sentence` student of the tiny model (`tiny_student`)."""
    from distributed_scoring.workflows.maskless import check_student
    from distributed_scoring.workloads.maskless import maskless_workload

    config = model_config(job, inputs, tiny_student(job.model))
    check_student(config)
    return config, maskless_workload(config.model, config.scoring)


def tiny_student(model: str) -> str:
    """A `sentence` maskless student of the tiny model, saved beside it once: its encoder and a fresh
    head (what `dscore train maskless --target sentence` writes; untrained, as the model is random)."""
    folder = Path(model).with_name(Path(model).name + "-student")
    if not (folder / "maskless.json").exists():
        from distributed_scoring.config import ModelSpec
        from distributed_scoring.engine.masked_lm import load_masked_lm
        from distributed_scoring.engine.maskless import regressor_for, save_student

        mlm = load_masked_lm(ModelSpec(model, device="cpu"))
        scratch = folder.with_name(folder.name + ".tmp")
        save_student(
            mlm,
            scratch,
            {"target": "sentence", "teacher": "none: a random model (scale benchmark)"},
            regressor_for(mlm, mean=-40.0, std=10.0),
        )
        scratch.rename(folder)
    return str(folder)


# Scorer name -> (RunJob, InputSpec) -> (RunConfig, Workload): a new scorer is one entry here and one in SCORERS.
RUNS = {"noop": noop_run, "tiny": pll_run, "tiny-unmasked": unmasked_run, "tiny-student": student_run}


def run_job(job: RunJob) -> dict:
    """Claim, execute and summarize `job`'s run in this process (on Ray when its mode says), timed in parts."""
    from distributed_scoring.config import InputSpec
    from distributed_scoring.pipeline.aggregate import summarize
    from distributed_scoring.pipeline.runner import claimed, execute

    from scale_stages import actor_peaks, holding, peak_rss_kb, recorded

    process_start = _process_start()
    inputs = InputSpec(job.paths, shard_rows=job.shard_rows, partition_column=job.partition_column)
    config, workload = RUNS[job.scorer](job, inputs)
    os.makedirs(job.memory, exist_ok=True)
    workload = recorded(workload, job.memory)
    if job.hold_after is not None:
        workload = holding(workload, job.hold_after, os.path.join(job.memory, "hold"))
    ray_options = start_ray(job.mode)
    rss_start = peak_rss_kb()
    new_markers = NewMarkers(job.output)
    started, started_ns = time.perf_counter(), time.time_ns()
    startup_s = started_ns / 1e9 - process_start
    with claimed(config, workload) as (shards, out, todo):
        claimed_at = time.perf_counter()
        execute(workload, config, todo, out, ray_options, progress=False)
        executed_at = time.perf_counter()
        summary = summarize(out, shards, config)
        ended = time.perf_counter()
    first_marker = new_markers.first_after(started_ns)
    if ray_options is not None:
        import ray

        ray.shutdown()
    files, size = folder_size(Path(job.output))
    todo_rows = sum(s.rows for s in todo)
    return {
        "rows": summary["rows"],
        "shards": len(shards),
        "todo_shards": len(todo),
        "todo_rows": todo_rows,
        "startup_s": startup_s,
        "claim_s": claimed_at - started,
        "execute_s": executed_at - claimed_at,
        "summary_s": ended - executed_at,
        "total_s": ended - started,
        "first_marker_s": first_marker,
        "rows_per_s": todo_rows / (ended - started),
        "driver_rss_start_kb": rss_start,
        "driver_peak_rss_kb": peak_rss_kb(),
        "actor_peak_rss_kb": actor_peaks(job.memory, os.getpid()),
        "files_written": files,
        "bytes_written": size,
        "torch_threads": job.threads,
    }


def _process_start() -> float:
    import psutil

    return psutil.Process().create_time()


def folder_size(folder: Path) -> tuple[int, int]:
    """(files, bytes) under `folder`."""
    files = size = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            files += 1
            size += os.path.getsize(os.path.join(dirpath, name))
    return files, size


def markers(output: Path) -> int:
    try:
        return sum(1 for e in os.scandir(output / "_done") if e.name.endswith(".json"))
    except FileNotFoundError:
        return 0


# ---------------------------------------------------------------------------------------------------
# The measurements (each in its own process).


def measure(spec: Spec, settings: Settings, scratch: Path) -> dict:
    corpora = Path(settings.corpora)
    if spec.kind == "run":
        return run_job(_job(spec, settings, scratch, (str(sentence_corpus(corpora, spec.n)),)))
    if spec.kind == "many-files":
        folder = many_files_corpus(corpora, spec.files)
        return {**run_job(_job(spec, settings, scratch, (str(folder),))), "input_bytes": folder_size(folder)[1]}
    if spec.kind == "large-file":
        return measure_large_file(spec, settings, scratch)
    if spec.kind == "resume":
        return measure_resume(spec, settings, scratch)
    if spec.kind == "audit":
        return measure_audit(spec, settings, scratch)
    if spec.kind == "rescore":
        return measure_rescore(spec, settings, scratch)
    raise ValueError(f"unknown measurement kind {spec.kind!r}")


def _job(spec: Spec, settings: Settings, scratch: Path, paths: tuple[str, ...], **changes: Any) -> RunJob:
    return RunJob(
        paths,
        str(scratch / "out"),
        str(scratch / "memory"),
        spec.scorer,
        settings.tiny_model,
        spec.mode,
        settings.shard_rows,
        settings.threads,
        **changes,
    )


def run_in_child(job: RunJob, scratch: Path, name: str) -> tuple[subprocess.Popen, Path]:
    """Start `job` in a child process (its own session); returns it and where it writes its result."""
    result = scratch / f"{name}.json"
    process = spawn(SCRIPT, ["--run-job", json.dumps(asdict(job)), "--result", str(result)], scratch / f"{name}.log")
    return process, result


def finished_child(process: subprocess.Popen, result: Path, scratch: Path, name: str) -> dict:
    if process.wait() != 0:
        raise RuntimeError(f"the {name} run failed (exit {process.returncode}): {last_line(scratch / f'{name}.log')}")
    return json.loads(result.read_text())


def measure_resume(spec: Spec, settings: Settings, scratch: Path) -> dict:
    """Kill the run at half way, then rerun it into the same folder. The run holds once it has scored half
    its shards and is killed once their markers are written: watched from here alone, a run of fast shards
    on a busy machine could mark all of them before this process looked, and its rerun had nothing to do."""
    job = _job(spec, settings, scratch, (str(sentence_corpus(Path(settings.corpora), spec.n)),))
    shards = math.ceil(spec.n / settings.shard_rows)
    half = shards // 2
    first, _ = run_in_child(replace(job, hold_after=half), scratch, "killed")
    started = time.perf_counter()
    while first.poll() is None and markers(Path(job.output)) < half:
        time.sleep(POLL_S)
    killed = first.poll() is None
    kill_tree(first.pid)
    first.wait()
    killed_after = time.perf_counter() - started
    done = markers(Path(job.output))
    second, result = run_in_child(job, scratch, "rerun")
    rerun = finished_child(second, result, scratch, "rerun")
    return {"shards": shards, "killed": killed, "killed_after_s": killed_after, "marked_at_kill": done, "rerun": rerun}


def measure_audit(spec: Spec, settings: Settings, scratch: Path) -> dict:
    """Score with pseudo-random scores in a child, then audit here: alone, then against itself as baseline."""
    from distributed_scoring.io.output import REPORT_HTML
    from distributed_scoring.workflows.audit.baseline import AUDIT_FILE
    from distributed_scoring.workflows.audit.figures import run_audit

    from scale_stages import peak_rss_kb

    job = _job(
        spec,
        settings,
        scratch,
        (str(audit_corpus(Path(settings.corpora), spec.n)),),
        scores="hash",
        per_token=True,
        partition_column="source",
    )
    scoring = finished_child(*run_in_child(job, scratch, "scoring"), scratch, "scoring")
    rss_start = peak_rss_kb()
    # The audit writes beside the rows in `dscore audit`, under the scoring run's claim; here the scored
    # folder is an input and the audit claims a folder of its own (the same work, timed apart).
    scored, out, again = Path(job.output), scratch / "audit", scratch / "again"
    started = time.perf_counter()
    first = run_audit(str(scored), str(out))
    audited = time.perf_counter()
    rss_audit = peak_rss_kb()
    second = run_audit(str(scored), str(again), baseline=str(out))
    ended = time.perf_counter()
    return {
        "scoring": scoring,
        "partitions": len(first.record.partitions),
        "audit_s": audited - started,
        "audit_baseline_s": ended - audited,
        "outliers": first.record.outliers.count,
        "report_bytes": (out / REPORT_HTML).stat().st_size,
        "audit_json_bytes": (out / AUDIT_FILE).stat().st_size,
        "report_baseline_bytes": (again / REPORT_HTML).stat().st_size,
        "verdict": second.record.baseline.verdict,
        "driver_rss_start_kb": rss_start,
        "driver_rss_after_audit_kb": rss_audit,
        "driver_peak_rss_kb": peak_rss_kb(),
    }


def measure_rescore(spec: Spec, settings: Settings, scratch: Path) -> dict:
    """The steps of `rescore_nbest` (workflows/rescore/run.py) in order, each timed, the scoring by the
    no-op workload (pseudo-random scores) in this process."""
    import pyarrow as pa

    from distributed_scoring.config import InputSpec, ModelSpec, RunConfig
    from distributed_scoring.io import schema as S
    from distributed_scoring.io.claim import claim
    from distributed_scoring.io.nbest import unique_texts
    from distributed_scoring.pipeline.runner import run
    from distributed_scoring.workflows.rescore.outputs import OUTPUT_FILES, write_outputs
    from distributed_scoring.workflows.rescore.rescoring import rescore
    from distributed_scoring.workflows.rescore.run import MLM, TEXTS, _read, _scores
    from distributed_scoring.workflows.rescore.search import RescoreOptions

    from scale_stages import NOOP_MODEL, NoopOptions, noop_workload, peak_rss_kb

    dev_path, test_path = nbest_lists(Path(settings.corpora), spec.n)
    output = str(scratch / "out")
    rss_start = peak_rss_kb()
    times = [time.perf_counter()]
    dev, test = _read(str(dev_path), None, "dev"), _read(str(test_path), None, "test")
    texts = unique_texts(dev, test)
    times.append(time.perf_counter())
    with claim(output, [str(dev_path), str(test_path)]) as folder:
        folder.begin({"workload": "rescore"}, None, [TEXTS, MLM, *OUTPUT_FILES])
        texts_file = folder.write_table(TEXTS, pa.table({S.ID: [f"{i:09d}" for i in range(len(texts))], S.TEXT: texts}))
        corpus = InputSpec((texts_file,), id_column=S.ID, shard_rows=settings.shard_rows)
        times.append(time.perf_counter())
        config = RunConfig(corpus, ModelSpec(NOOP_MODEL), output=folder.subfolder(MLM))
        run(config, noop_workload(NoopOptions("hash")))
        times.append(time.perf_counter())
        mlm = _scores(config.output, texts, texts, S.PLL, "masked LM")
        times.append(time.perf_counter())
        rss_tuning = peak_rss_kb()
        result = rescore(dev, test, mlm, None, RescoreOptions())
        times.append(time.perf_counter())
        write_outputs(result, folder)
        times.append(time.perf_counter())
    steps = ("read_dedupe_s", "write_texts_s", "scoring_s", "join_s", "tuning_s", "write_s")
    return {
        "hypotheses": dev.num_rows + test.num_rows,
        "utterances": result.report["dev"]["utterances"] + result.report["test"]["utterances"],
        "unique_texts": len(texts),
        **{name: b - a for name, a, b in zip(steps, times, times[1:])},
        "after_scoring_s": times[-1] - times[3],
        "grid_points": len(result.report["grid"]["lambda"]),
        "dev": result.report["dev"],
        "driver_rss_start_kb": rss_start,
        "driver_rss_before_tuning_kb": rss_tuning,
        "driver_peak_rss_kb": peak_rss_kb(),
    }


def measure_large_file(spec: Spec, settings: Settings, scratch: Path) -> dict:
    """The large file `prepare` wrote into the scratch folder (deleted with it by the harness)."""
    path = large_file(scratch, spec.n)
    return {**run_job(_job(spec, settings, scratch, (str(path),))), "input_bytes": path.stat().st_size}


# ---------------------------------------------------------------------------------------------------
# The harness: plan, run each measurement in a child, journal, tables, plot.


def run_measurement(spec: Spec, settings: Settings, work: Path, timeout_s: float, info: dict) -> dict:
    """One measurement in a child process, under `timeout_s`; its journal record."""
    scratch = work / "scratch" / spec.key.replace("/", "_")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    log = work / "logs" / f"{spec.key.replace('/', '_')}.log"
    log.parent.mkdir(exist_ok=True)
    log.write_text("")
    result_file = scratch / "result.json"
    prepared_at = time.perf_counter()
    try:
        skip = prepare(spec, Path(settings.corpora), scratch)
    except OSError as exc:  # a full disk, say: this measurement fails, the others go on
        skip = f"its input could not be written: {exc}"
    prepare_s = time.perf_counter() - prepared_at
    load_start, started = os.getloadavg(), time.perf_counter()
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if skip is None:
        process = spawn(
            SCRIPT,
            [
                "--measure",
                json.dumps(asdict(spec)),
                "--settings",
                json.dumps(asdict(settings)),
                "--scratch",
                str(scratch),
                "--result",
                str(result_file),
            ],
            log,
        )
        status = wait_child(process, timeout_s, log, spec.label)
    else:
        status = "skipped"
    record = {
        "key": spec.key,
        "spec": asdict(spec),
        "started": when,
        "status": status,
        "timeout_s": timeout_s,
        "wall_s": time.perf_counter() - started,
        "prepare_s": prepare_s,
        "load_start": load_start,
        "load_end": os.getloadavg(),
        "machine": info,
        "settings": {k: v for k, v in asdict(settings).items() if k != "corpora"},
    }
    if status == "ok":
        record["result"] = json.loads(result_file.read_text())
    elif status == "skipped":
        record["result"] = {"skipped": skip}
    else:
        record["log_tail"] = log.read_text()[-3000:]
    shutil.rmtree(scratch, ignore_errors=True)
    return record


def outcome(record: dict) -> str:
    """One line of what a measurement found."""
    from scale_report import mib, seconds

    r = record.get("result", {})
    kind = record["spec"]["kind"]
    if record["status"] != "ok":
        return record["status"] + (f": {r['skipped']}" if "skipped" in r else "")
    if kind in ("run", "many-files", "large-file"):
        return (
            f"{r['rows_per_s']:,.0f} rows/s, first shard {seconds(r['first_marker_s'])} s, summary "
            f"{seconds(r['summary_s'])} s, driver {mib(r['driver_peak_rss_kb'])} MiB"
        )
    if kind == "resume":
        rerun = r["rerun"]
        return (
            f"killed at {r['marked_at_kill']}/{r['shards']} shards; rerun claim {seconds(rerun['claim_s'])} s, "
            f"first new shard {seconds(rerun['first_marker_s'])} s"
        )
    if kind == "audit":
        return (
            f"audit {seconds(r['audit_s'])} s, with baseline {seconds(r['audit_baseline_s'])} s, report "
            f"{r['report_bytes'] / 1e3:,.0f} kB, driver {mib(r['driver_peak_rss_kb'])} MiB"
        )
    return (
        f"tuning {seconds(r['tuning_s'])} s, after scoring {seconds(r['after_scoring_s'])} s, driver "
        f"{mib(r['driver_peak_rss_kb'])} MiB"
    )


def main() -> None:
    args = parse_args()
    if args.measure:
        _child_main(args)
    elif args.run_job:
        _run_job_main(args)
    else:
        from distributed_scoring.offline.models import cache_root

        import machine

        info = machine.describe(("torch", "transformers", "pyarrow", "ray", "numpy"))
        out = args.out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        journal = measure_all(args, out / "scale.jsonl", (args.work or cache_root() / "bench-scale").resolve(), info)
        write_results(list(journal.values()), info, args, out)


def measure_all(args: argparse.Namespace, journal_path: Path, work: Path, info: dict) -> dict[str, dict]:
    """Run every planned measurement not yet in the journal, printing progress and estimates; returns the
    journal (every record, also of measurements not planned this time)."""
    from distributed_scoring.offline.models import cache_root

    corpora = work / "corpora"
    corpora.mkdir(parents=True, exist_ok=True)
    journal = load_journal(journal_path)
    specs = plan(
        args.sizes,
        args.scorers,
        args.modes,
        args.kinds,
        args.model_max,
        args.shard_rows,
        args.many_files,
        args.large_gb,
    )
    todo = [s for s in specs if not is_finished(journal.get(s.key), args.timeout)]
    tiny = None
    if any(s.scorer in MODEL_SCORERS for s in todo):
        from joints_speed import tiny_bert

        tiny = str(tiny_bert(args.models_dir or cache_root() / "bench-models"))
    settings = Settings(str(corpora), args.threads, args.shard_rows, tiny)
    total = sum(estimate_s(s, journal, corpora) for s in todo)
    print(
        f"{len(specs)} measurements planned, {len(specs) - len(todo)} already in {journal_path}; {len(todo)} to "
        f"run, estimated {duration(total)} (at most {duration(args.timeout)} each); load average "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    if os.getloadavg()[0] > 0.5:
        print("  the machine is busy: these timings will be disturbed", flush=True)
    begun = time.perf_counter()
    for i, spec in enumerate(todo):
        left = sum(estimate_s(s, journal, corpora) for s in todo[i:])
        print(
            f"[{i + 1}/{len(todo)}] {spec.label} (estimate {duration(estimate_s(spec, journal, corpora))}; "
            f"elapsed {duration(time.perf_counter() - begun)}, left ~{duration(left)})",
            flush=True,
        )
        record = run_measurement(spec, settings, work, args.timeout, info)
        append_journal(journal_path, record)
        journal[spec.key] = record
        print(
            f"      {outcome(record)} ({duration(record['wall_s'])}; load {record['load_start'][0]:.1f} -> "
            f"{record['load_end'][0]:.1f})",
            flush=True,
        )
        if record["status"] == "failed":
            print("      " + (record["log_tail"].strip().splitlines() or [""])[-1][-300:], flush=True)
    return journal


def write_results(records: list[dict], info: dict, args: argparse.Namespace, out: Path) -> None:
    """scale.json, scale.png and scale.md in `out` (and the tables in RESULTS.md when asked)."""
    import results_md
    import scale_report

    settings = {
        k: v
        for k, v in vars(args).items()
        if k not in ("out", "update_results", "measure", "settings", "scratch", "run_job", "result")
    }
    raw = {"machine": info, "settings": settings, "measurements": records}
    (out / "scale.json").write_text(json.dumps(raw, indent=1, default=str))
    plot = scale_report.plot(records, out / "scale.png")
    table = scale_report.markdown(records, info, image=plot and plot.name)
    (out / "scale.md").write_text(table)
    print(table)
    if args.update_results:
        image = plot and os.path.relpath(plot, args.update_results.resolve().parent)
        results_md.update_section(
            args.update_results, "scale", scale_report.markdown(records, info, image), "benchmarks/scale.py"
        )


def _child_main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    spec, settings = Spec(**json.loads(args.measure)), Settings(**json.loads(args.settings))
    _set_threads(settings.threads)
    result = measure(spec, settings, Path(args.scratch))
    Path(args.result).write_text(json.dumps(result))


def _run_job_main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    fields = json.loads(args.run_job)
    job = RunJob(**{**fields, "paths": tuple(fields["paths"])})
    _set_threads(job.threads)
    Path(args.result).write_text(json.dumps(run_job(job)))


def _set_threads(threads: int) -> None:
    """Torch's intra-op threads for runs in this process (environment first, for libraries read at import)."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)


def _sizes(value: str) -> list[int]:
    return [int(float(v)) for v in value.split(",") if v]


def _names(allowed: tuple[str, ...]):
    def parse(value: str) -> list[str]:
        names = [v for v in value.split(",") if v]
        unknown = [v for v in names if v not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"{unknown} not among {allowed}")
        return names

    return parse


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=_sizes, default=list(SIZES), help="rows (1e3,1e4,...; default 10^3-10^6)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="10^3 and 10^4 rows (the tiny model 10^3 only), 1,000 small files, a 50 MB large file: checks every path",
    )
    parser.add_argument("--kinds", type=_names(KINDS), default=list(KINDS), help=f"comma-separated, of {KINDS}")
    parser.add_argument("--scorers", type=_names(SCORERS), default=list(SCORERS), help=", ".join(SCORERS))
    parser.add_argument("--modes", type=_names(MODES), default=list(MODES), help=f"comma-separated, of {MODES}")
    parser.add_argument("--model-max", type=int, default=MODEL_MAX, help="largest corpus for the tiny model")
    parser.add_argument("--shard-rows", type=int, default=1000)
    parser.add_argument("--many-files", type=int, default=10**4, help="files of the many-small-files input")
    parser.add_argument("--large-gb", type=float, default=4.0, help="size of the large file (0: none)")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads of in-process model runs (Ray actors get their CPUs' worth)",
    )
    parser.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds per measurement")
    parser.add_argument(
        "--models-dir", type=Path, help="where the tiny model is saved (default: the cache's bench-models)"
    )
    parser.add_argument(
        "--out", type=Path, default=SCRIPT.parent / "results", help="scale.jsonl/.json/.md/.png go here"
    )
    parser.add_argument(
        "--work", type=Path, help="corpora (kept), logs and scratch folders (default: the cache's bench-scale)"
    )
    parser.add_argument("--update-results", type=Path, help="also write the tables into this RESULTS.md")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    parser.add_argument("--run-job", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.sizes = list(QUICK_SIZES)
        args.model_max = min(args.model_max, QUICK_SIZES[0])
        args.many_files = min(args.many_files, 1000)
        args.large_gb = min(args.large_gb, 0.05)
    return args


if __name__ == "__main__":
    main()
