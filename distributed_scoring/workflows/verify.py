"""`dscore verify`: whether an output folder is complete, incomplete or damaged, for every command's layout.

Resume trusts markers cheaply (row counts from Parquet metadata); this reads everything once (on S3, all
that a listing does not show unchanged: below). A folder of a scoring run (score, audit, infill, sample,
generate, and the runs inside rescore, joints and train folders) is complete when every shard of its plan
(`_run.json` records their keys and rows) is marked done, each marker agrees with its file (rows and the
file's digest) and with the plan, the rows read as one dataset with the required columns and each row's key
(`id` and the columns its workload declares, as `_run.json` records them) once, and `summary.json` (for the
runs that write one) is there and counts those rows; an audit's `audit.json` and `row_stats.parquet` count
them too. A missing shard or summary, or a lock left by a run that is gone, makes it incomplete (rerunning
the same command finishes it), and so do the temporary files in `rows/` and `_done/` of such an unfinished
run (the rerun removes them); anything that disagrees with the bookkeeping, or is left over in a finished
folder (temporary files, a Parquet file without a marker, a marker without its file), makes it damaged.
Folders of `rescore` and `joints` are verified through their runs (`mlm/`, `causal/`, `scores/`, ...) and
their reports, training folders through their report and evaluation runs. An older folder's plan, recorded
only as a digest, is made again from its inputs; what cannot be checked is said. Reads only the id column's
values, so memory grows with the number of rows' ids, not with their scores.

On S3 a finished run's folder is verified from a few listings: a file listed with the MD5 its marker records
(the ETag of an object written in one PUT) holds the bytes its run wrote, so their digest is theirs and
they are not read again; markers the run checked when it finished are read from its index
(`io.output.INDEX_FILE`) while a listing shows them unchanged. When every marked file is such a file, the rows
are counted from the markers and not read as one dataset: they are the rows their run wrote, from input rows
whose ids it checked unique before any work. Anything else (a file or marker changed since, a store that
lists no checksums, a local disk) is read and checked in full.
"""

from __future__ import annotations

import hashlib
import posixpath
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..config import InputSpec
from ..errors import UserError
from ..io import schema as S
from ..io.claim import TRAINING
from ..io.lock import STALE_AFTER_S, read_holder
from ..io.output import (
    DONE_DIR,
    FILE_DIGEST,
    LOCK_FILE,
    OUTPUTS,
    REPORT_JSON,
    ROW_KEY,
    ROWS_DIR,
    ROWS_PER_INPUT,
    RUN_FILE,
    SHARDS,
    SUMMARY_FILE,
    OutputDir,
    ShardCheck,
    part_name,
    plan_digest,
)
from ..io.sources import plan_shards
from ..io.storage import join
from .audit.baseline import AUDIT_FILE
from .audit.row_stats import ROW_STATS_FILE
from .joints import EARLIER_LAYOUT as JOINTS_LAYOUT
from .rescore.run import EARLIER_LAYOUT as RESCORE_LAYOUT
from .train.run import CHECKPOINTS

REQUIRED_COLUMNS = (S.ID, S.STATUS, S.ERROR)  # what every workload's rows carry
# How the rows of a folder whose `_run.json` records no row key (an earlier dscore) are told apart beside
# their id: whichever of these columns they hold (joints', generate's and sample's, and `line` of
# --allow-duplicate-ids). Newer runs record their workload's own key.
EARLIER_ROW_KEY = ("construction", "sequence", "chain", "epoch", S.LINE)
# Runs that write no summary.json of their own (their command summarises in the folder above).
WITHOUT_SUMMARY = ("causal", "joints-")


class NotARunFolderError(UserError):
    """The folder holds no `_run.json`, nor any run's folder: nothing to verify."""


@dataclass(frozen=True)
class Verification:
    """What `verify_folder` found: problems (damage), what is missing (an unfinished run), what could
    not be checked, and the verifications of the runs inside it."""

    folder: str
    shards: int = 0
    rows: int = 0
    planned: int | None = None  # shards in the plan, when known
    problems: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    unchecked: tuple[str, ...] = ()
    parts: tuple["Verification", ...] = ()
    what: str | None = None  # the verdict's description, for folders that are not one scoring run
    in_use: str | None = None  # the live run that holds the folder, which is then not checked

    @property
    def damaged(self) -> bool:
        return bool(self.problems) or any(p.damaged for p in self.parts)

    @property
    def complete(self) -> bool:
        return not self.missing and all(p.complete for p in self.parts)

    @property
    def ok(self) -> bool:
        return self.complete and not self.damaged and self.in_use is None


def verify_folder(uri: str) -> Verification:
    """Check the folder at `uri`: a run's, or one holding runs (rescore, joints, older ones without a
    `_run.json` of their own); raises `NotARunFolderError` when it is neither."""
    out = OutputDir(uri)
    holder = in_use_by(out)
    if holder is not None:
        return Verification(uri, in_use=holder)
    try:
        run = out.read_json(RUN_FILE)
    except ValueError as exc:
        return _verify_shards(out, {}, [f"{RUN_FILE} is not valid JSON ({exc})"])
    if run is None:
        runs = _sub_runs(out)
        earlier = [name for name in runs if name in (*RESCORE_LAYOUT, *JOINTS_LAYOUT)]
        if not earlier:
            inside = f" (it holds run folders: {', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''})" if runs else ""
            raise NotARunFolderError(f"{uri} holds no {RUN_FILE}: it is not a dscore output folder{inside}")
        parts = tuple(verify_folder(join(uri, name)) for name in earlier)
        return Verification(
            uri,
            parts=parts,
            missing=tuple(_lock(out)),
            what=counted(len(parts), "run"),
            unchecked=(
                f"{uri}'s own files: an earlier dscore wrote no {RUN_FILE} in the folder of a rescore or joints run",
            ),
        )
    workload = str(run.get("workload", ""))
    if workload.startswith(TRAINING):
        return _verify_training(out, run)
    if "plan" not in run:  # every shard run records its plan; a folder of runs (rescore, joints, variants) has none
        return _verify_parent(out, run)
    return _verify_shards(out, run, [])


def _sub_runs(out: OutputDir) -> list[str]:
    """Folders below `out` (two levels at most, not a run's rows) holding a `_run.json`, relative to it:
    the runs inside a rescore, joints or training folder."""
    found = []
    for info in out.fs.get_file_info(pafs.FileSelector(out.root, recursive=True, allow_not_found=True)):
        name = posixpath.relpath(info.path, out.root)
        parts = name.split("/")
        if parts[-1] == RUN_FILE and 2 <= len(parts) <= 3 and not {ROWS_DIR, DONE_DIR} & set(parts):
            found.append(posixpath.dirname(name))
    return sorted(found)


def _lock(out: OutputDir) -> list[str]:
    """A lock left by a run that is gone (killed, or silent for `STALE_AFTER_S`): the run did not finish, and a
    rerun of the same command takes the folder over and finishes it."""
    holder = read_holder(out)
    if holder is None:
        return []
    return [f"{LOCK_FILE} was left by {holder.describe()}, which is gone: the run did not finish"]


def in_use_by(out: OutputDir) -> str | None:
    """Who holds the folder, when a live run does (its files are being written: no verdict can be given)."""
    holder = read_holder(out)
    if holder is None or holder.killed() or holder.stale_because(time.time(), STALE_AFTER_S):
        return None
    return holder.describe()


# A scoring run's folder.


def _verify_shards(out: OutputDir, run: dict, problems: list[str]) -> Verification:
    missing: list[str] = _lock(out)
    unchecked: list[str] = []
    check = out.check_shards()
    markers = _check_markers(out, check, problems)
    keys = set(markers)
    plan = run.get(SHARDS)
    if plan is None and run:
        plan, reason = _earlier_plan(run)
        if reason:
            unchecked.append(f"the shard plan: {reason}")
    strays, cut_off = _strays(out, keys | set(plan or ()))
    problems += strays
    if plan is not None:
        _check_plan(out, run, plan, markers, check, problems, missing)
        keys &= set(plan)
    if keys and keys <= check.proven:  # every file the bytes its run wrote: counted from the markers
        rows = sum(markers[k]["rows"] for k in keys)
    else:
        rows = _check_rows(out, keys, run.get(ROW_KEY), problems)
    _check_summary(out, run, plan, rows, problems, missing)
    if AUDIT_FILE in run.get(OUTPUTS, ()) or out.exists(out.path(AUDIT_FILE)):
        _check_audit(out, rows, problems, missing)
    missing += _unwritten(out, run, missing)
    # A write cut off by the end of a run that did not finish (killed, stopped): the rerun removes it. In a
    # finished folder no run left it, so it is damage.
    (missing if missing else problems).extend(
        f"{name}: a temporary file of a write the run did not finish (the rerun removes it)" for name in cut_off
    )
    return Verification(
        out.uri,
        len(keys),
        rows,
        len(plan) if plan is not None else None,
        tuple(problems),
        tuple(missing),
        tuple(unchecked),
    )


def _unwritten(out: OutputDir, run: dict, missing: list[str]) -> list[str]:
    """The files `_run.json` lists beside the shards that are not there (a run stopped while it wrote them,
    before its report), other than those the checks before said to be missing."""
    return [
        f"{name} is missing: the run did not finish"
        for name in run.get(OUTPUTS, ())
        if not any(m.startswith(f"{name} is missing") for m in missing) and not out.exists(out.path(name))
    ]


def _check_markers(out: OutputDir, check: ShardCheck, problems: list[str]) -> dict[str, dict]:
    """The sound markers (key -> marker): each agrees with its Parquet file (rows, and its digest when recorded,
    read unless a listing showed the file to hold the bytes its marker describes: `ShardCheck.proven`)."""
    markers = {}
    for key in sorted({*check.markers, *check.problems}):
        problem = check.problems.get(key)
        if problem is None and key not in check.proven:
            problem = _digest_problem(out, key, check.markers[key])
        if problem is None:
            markers[key] = check.markers[key]
        else:
            problems.append(f"shard {key}: {problem}")
    return markers


def _digest_problem(out: OutputDir, key: str, marker: dict) -> str | None:
    recorded = marker.get(FILE_DIGEST)
    if recorded is None:
        return None
    with out.fs.open_input_stream(out.part_path(key)) as stream:
        digest = hashlib.sha256(stream.read()).hexdigest()
    return None if digest == recorded else "its Parquet file's bytes differ from those its marker recorded"


def _earlier_plan(run: dict) -> tuple[dict | None, str | None]:
    """The plan of a folder whose `_run.json` records it only as a digest (an earlier dscore): made again
    from its inputs and checked against the digest; else None and why."""
    try:
        spec = InputSpec(
            tuple(run["inputs"]),
            run["text_column"],
            run["id_column"],
            run["shard_rows"],
            run.get("partition_column"),
            run.get("partition_by_file", False),
            tuple(run.get("extra_columns", ())),
        )
        plan = plan_shards(spec)
    except (KeyError, TypeError, UserError, OSError) as exc:
        return None, (
            f"{RUN_FILE} records it only as a digest (an earlier dscore wrote it), and its inputs cannot "
            f"be planned again ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}): missing "
            "shards cannot be told"
        )
    if plan_digest(plan) != run.get("plan"):
        return None, (
            f"{RUN_FILE} records it only as a digest (an earlier dscore wrote it), and the inputs now give "
            "another plan: missing shards cannot be told"
        )
    return {s.key: s.rows for s in plan}, None


def _check_plan(
    out: OutputDir,
    run: dict,
    plan: dict,
    markers: dict[str, dict],
    check: ShardCheck,
    problems: list[str],
    missing: list[str],
) -> None:
    """Every planned shard marked (`markers`: the sound ones) and holding its rows (input rows x rows per input,
    when recorded); no marked shard outside the plan."""
    per_input = run.get(ROWS_PER_INPUT)
    for key in sorted(set(markers) - set(plan)):
        problems.append(f"shard {key} is marked done but is not in the run's plan")
    for key, rows in sorted(plan.items()):
        if key not in markers:
            unmarked = key not in check.markers and key not in check.problems
            written = (
                " (its file is there without a marker: the run stopped while writing it)"
                if unmarked and out.part_path(key) in check.files
                else ""
            )
            missing.append(f"shard {key} ({rows} input rows) is not done{written}")
        elif per_input is not None and (marked := markers[key]["rows"]) != rows * per_input:
            problems.append(f"shard {key} holds {marked} rows, its plan {rows * per_input}")


def _strays(out: OutputDir, keys: set[str]) -> tuple[list[str], list[str]]:
    """(problems, cut off): temporary files anywhere but in rows/ and _done/, and files under rows/ that are not
    a shard's of `keys` (the marked and the planned ones: a planned shard's file without a marker is an
    unfinished shard, not a stray); and the temporary files in rows/ and _done/, which a rerun removes."""
    wanted = {posixpath.join(ROWS_DIR, part_name(k)) for k in keys}
    problems, cut_off = [], []
    infos = out.fs.get_file_info(pafs.FileSelector(out.root, recursive=True))
    for info in sorted(infos, key=lambda i: i.path):
        name = posixpath.relpath(info.path, out.root)
        if info.type != pafs.FileType.File:
            continue
        if name.endswith(".tmp") and posixpath.dirname(name) in (ROWS_DIR, DONE_DIR):
            cut_off.append(name)
        elif name.endswith(".tmp"):
            problems.append(f"{name}: a temporary file left by a run that did not finish")
        elif name.startswith(f"{ROWS_DIR}/") and name not in wanted:
            problems.append(f"{name}: a file without a completion marker (no row of the run: readers leave it out)")
    return problems, cut_off


def _check_rows(out: OutputDir, keys: set[str], row_key: list[str] | None, problems: list[str]) -> int:
    """Read the marked shard files as one dataset: required columns, each row's key (`row_key`, else that of
    an earlier dscore's folder) once; returns the rows counted."""
    paths = [out.part_path(k) for k in sorted(keys)]
    if not paths:
        return 0
    try:
        dataset = pq.ParquetDataset(paths, filesystem=out.fs)
        names = dataset.schema.names
        row_key = _key_columns(row_key, names)
        missing = [c for c in dict.fromkeys([*REQUIRED_COLUMNS, *row_key]) if c not in names]
        if missing:
            problems.append(
                f"{ROWS_DIR}/ lacks the {'column' if len(missing) == 1 else 'columns'} {', '.join(missing)}"
            )
            return 0
        table = dataset.read(columns=row_key)
    except (OSError, pa.ArrowInvalid) as exc:
        problems.append(f"{ROWS_DIR}/ cannot be read as one dataset ({exc})")
        return 0
    problems += _duplicates(table)
    return table.num_rows


def _key_columns(row_key: list[str] | None, names: list[str]) -> list[str]:
    """The columns that key the rows: those `_run.json` records (`id` first), or, in an earlier dscore's
    folder, `id` and whichever of `EARLIER_ROW_KEY` the rows hold."""
    if row_key is None:
        return [S.ID, *(c for c in EARLIER_ROW_KEY if c in names)]
    return [S.ID, *(c for c in row_key if c != S.ID)]


def _duplicates(table: pa.Table) -> list[str]:
    keys = table.group_by(table.column_names).aggregate([([], "count_all")])
    repeated = keys.filter(pc.greater(keys["count_all"], 1))
    if not repeated.num_rows:
        return []
    examples = ", ".join(repr(i) for i in repeated[S.ID].to_pylist()[:5])
    verb = "appears" if repeated.num_rows == 1 else "appear"
    return [f"{counted(repeated.num_rows, 'id')} {verb} more than once (e.g. {examples})"]


def _check_summary(
    out: OutputDir, run: dict, plan: dict | None, rows: int, problems: list[str], missing: list[str]
) -> None:
    """summary.json there (for the runs that write one) and counting the rows read (and, for PLL runs, the
    rows planned)."""
    try:
        summary = out.read_json(SUMMARY_FILE)
    except ValueError as exc:
        problems.append(f"{SUMMARY_FILE} is not valid JSON ({exc})")
        return
    if summary is None:
        writes = (
            SUMMARY_FILE in run[OUTPUTS] if OUTPUTS in run else not str(run.get("workload")).startswith(WITHOUT_SUMMARY)
        )
        if writes:
            missing.append(f"{SUMMARY_FILE} is missing: the run did not finish")
        return
    if "rows" in summary and summary["rows"] != rows:
        problems.append(f"{SUMMARY_FILE} counts {summary['rows']} rows, the files hold {rows}")
    expected = summary.get("rows_expected")
    if plan is not None and expected is not None and expected != sum(plan.values()):
        problems.append(f"{SUMMARY_FILE} expects {expected} rows, the plan has {sum(plan.values())}")


def _check_audit(out: OutputDir, rows: int, problems: list[str], missing: list[str]) -> None:
    """An audit's audit.json and row_stats.parquet there and counting the rows read."""
    try:
        audit = out.read_json(AUDIT_FILE)
    except ValueError as exc:
        problems.append(f"{AUDIT_FILE} is not valid JSON ({exc})")
        audit = {}
    if audit is None:  # written after row_stats.parquet: a stop before it may have cut that file short
        missing.append(f"{AUDIT_FILE} is missing: the audit did not finish")
        return
    if audit and audit.get("overall", {}).get("rows") != rows:
        problems.append(f"{AUDIT_FILE} counts {audit.get('overall', {}).get('rows')} rows, the files hold {rows}")
    if not out.exists(out.path(ROW_STATS_FILE)):
        missing.append(f"{ROW_STATS_FILE} is missing: the audit did not finish")
        return
    try:
        stats = pq.read_metadata(out.path(ROW_STATS_FILE), filesystem=out.fs).num_rows
    except (OSError, pa.ArrowInvalid) as exc:
        problems.append(f"{ROW_STATS_FILE} cannot be read ({exc})")
        return
    if stats != rows:
        problems.append(f"{ROW_STATS_FILE} holds {stats} rows, the files {rows}")


# Folders that hold runs.


def _verify_parent(out: OutputDir, run: dict) -> Verification:
    """A rescore, joints or variants folder: each run inside it, then the files the command writes once done."""
    outputs = run.get(OUTPUTS, [])
    parts = tuple(verify_folder(join(out.uri, name)) for name in outputs if out.exists(out.path(name, RUN_FILE)))
    missing = [f"{name} is missing: the run did not finish" for name in outputs if not out.exists(out.path(name))]
    return Verification(
        out.uri,
        missing=tuple([*_lock(out), *missing]),
        parts=parts,
        what=f"{run['workload']} run with {counted(len(parts), 'run')}",
    )


def _verify_training(out: OutputDir, run: dict) -> Verification:
    """A training folder: its report (written last), the model, and the evaluation runs inside it."""
    parts = tuple(verify_folder(join(out.uri, name)) for name in _sub_runs(out))
    missing, problems = _lock(out), []
    if not out.exists(out.path(REPORT_JSON)):
        steps = sorted(
            posixpath.basename(p)
            for p in out.files(CHECKPOINTS, suffix="")
            if posixpath.basename(p).startswith("step-")
        )
        latest = steps[-1] if steps else None
        missing.append(
            f"{REPORT_JSON} is missing: the training did not finish ("
            + (f"a rerun continues from {CHECKPOINTS}/{latest})" if latest else "no checkpoint yet)")
        )
    elif not out.exists(out.path("config.json")):
        problems.append("config.json is missing: the trained model is not in the folder")
    return Verification(
        out.uri,
        problems=tuple(problems),
        missing=tuple(missing),
        parts=parts,
        what=f"{run['workload']} run with {counted(len(parts), 'evaluation run')}",
    )


def report(result: Verification) -> str:
    """The lines `dscore verify` prints: the runs inside the folder first, then one per problem, per
    missing part and per thing not checked, then the verdict."""
    if result.in_use is not None:
        return f"IN USE: {result.folder}: a run is writing it ({result.in_use}); verify it once that run has ended"
    lines = [report(part) for part in result.parts]
    lines += [*result.problems, *result.missing, *(f"not checked: {u}" for u in result.unchecked)]
    what = result.what or f"{counted(result.shards, 'shard')}, {counted(result.rows, 'row')}"
    if result.damaged:
        count = len(result.problems) + sum(_problems(p) for p in result.parts)
        verdict = f"FAILED: {result.folder}: {counted(count, 'problem')}"
    elif not result.complete:
        done = (
            f"{result.shards} of {counted(result.planned, 'shard')} done, {counted(result.rows, 'row')}"
            if result.planned is not None
            else what
        )
        verdict = f"INCOMPLETE: {result.folder}: {done}; rerun the same command to finish"
    else:
        verdict = f"OK: {result.folder}: {what}"
    return "\n".join([*lines, verdict])


def counted(n: int, noun: str) -> str:
    """`n` and `noun`, in the plural unless `n` is 1: `1 run`, `2 runs`, `0 rows`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _problems(result: Verification) -> int:
    return len(result.problems) + sum(_problems(p) for p in result.parts)
