"""`dscore verify`: check that a finished output folder holds what its bookkeeping says.

Resume trusts markers cheaply (row counts from Parquet metadata); this reads everything once: every
marker against its file (rows and the file's digest), the rows as one dataset with the required columns
and each id once, `summary.json` against the files, and no leftovers (temporary files, a file without a
marker, a marker without a file, a lock). Reads only the id column's values, so memory grows with the
number of rows' ids, not with their scores.
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..io import schema as S
from ..errors import UserError
from ..io.output import DONE_DIR, FILE_DIGEST, LOCK_FILE, ROWS_DIR, RUN_FILE, SUMMARY_FILE, OutputDir, part_name

REQUIRED_COLUMNS = (S.ID, S.STATUS, S.ERROR)  # what every workload's rows carry
# Workloads writing several rows per id (joints, generate, sample) tell them apart by these; `line` keys rows
# whose ids repeat (--allow-duplicate-ids).
ROW_KEY_EXTRAS = ("construction", "sequence", "chain", "epoch", S.LINE)


class NotARunFolderError(UserError):
    """The folder holds no `_run.json`: nothing to verify."""


@dataclass(frozen=True)
class Verification:
    """What `verify_folder` found: one line per problem (empty when the folder is sound)."""

    folder: str
    shards: int = 0
    rows: int = 0
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_folder(uri: str) -> Verification:
    """Check the run folder at `uri`; raises `NotARunFolderError` when it is not one."""
    out = OutputDir(uri)
    if not out.exists(out.path(RUN_FILE)):
        raise NotARunFolderError(f"{uri} holds no {RUN_FILE}: it is not a dscore output folder")
    problems: list[str] = []
    try:
        out.read_json(RUN_FILE)
    except ValueError as exc:
        problems.append(f"{RUN_FILE} is not valid JSON ({exc})")
    if out.exists(out.path(LOCK_FILE)):
        problems.append(f"{LOCK_FILE} is present: a run holds the folder (or was killed and left it)")
    keys = _check_markers(out, problems)
    problems += _strays(out, keys)
    rows = _check_rows(out, keys, problems)
    return Verification(uri, len(keys), rows, tuple(problems))


def _check_markers(out: OutputDir, problems: list[str]) -> set[str]:
    """Keys of the markers; each checked against its Parquet file (rows, and its digest when recorded)."""
    keys = set()
    for path in out.files(DONE_DIR, suffix=".json"):
        key = posixpath.basename(path).removesuffix(".json")
        keys.add(key)
        problem = out.shard_problem(key)
        if problem is None:
            problem = _digest_problem(out, key)
        if problem is not None:
            problems.append(f"shard {key}: {problem}")
    return keys


def _digest_problem(out: OutputDir, key: str) -> str | None:
    recorded = out.read_marker(key).get(FILE_DIGEST)
    if recorded is None:
        return None
    with out.fs.open_input_stream(out.part_path(key)) as stream:
        digest = hashlib.sha256(stream.read()).hexdigest()
    return None if digest == recorded else "its Parquet file's bytes differ from those its marker recorded"


def _strays(out: OutputDir, keys: set[str]) -> list[str]:
    """Temporary files anywhere, and files under rows/ that are not a marked shard's."""
    wanted = {posixpath.join(ROWS_DIR, part_name(k)) for k in keys}
    problems = []
    infos = out.fs.get_file_info(pafs.FileSelector(out.root, recursive=True))
    for info in sorted(infos, key=lambda i: i.path):
        name = posixpath.relpath(info.path, out.root)
        if info.type != pafs.FileType.File:
            continue
        if name.endswith(".tmp"):
            problems.append(f"{name}: a temporary file left by a run that did not finish")
        elif name.startswith(f"{ROWS_DIR}/") and name not in wanted:
            problems.append(f"{name}: a file without a completion marker")
    return problems


def _check_rows(out: OutputDir, keys: set[str], problems: list[str]) -> int:
    """Read the marked shard files as one dataset: required columns, unique ids, rows as in the summary."""
    paths = [out.part_path(k) for k in sorted(keys) if out.exists(out.part_path(k))]
    if not paths:
        return 0
    try:
        dataset = pq.ParquetDataset(paths, filesystem=out.fs)
        names = dataset.schema.names
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            problems.append(f"{ROWS_DIR}/ lacks the column(s) {', '.join(missing)}")
            return 0
        table = dataset.read(columns=[S.ID, *(c for c in ROW_KEY_EXTRAS if c in names)])
    except (OSError, pa.ArrowInvalid) as exc:
        problems.append(f"{ROWS_DIR}/ cannot be read as one dataset ({exc})")
        return 0
    problems += _duplicates(table)
    problems += _summary_problem(out, table.num_rows)
    return table.num_rows


def _duplicates(table: pa.Table) -> list[str]:
    keys = table.group_by(table.column_names).aggregate([([], "count_all")])
    repeated = keys.filter(pc.greater(keys["count_all"], 1))
    if not repeated.num_rows:
        return []
    examples = ", ".join(repr(i) for i in repeated[S.ID].to_pylist()[:5])
    return [f"{repeated.num_rows} id(s) appear more than once (e.g. {examples})"]


def _summary_problem(out: OutputDir, rows: int) -> list[str]:
    try:
        summary = out.read_json(SUMMARY_FILE)
    except ValueError as exc:
        return [f"{SUMMARY_FILE} is not valid JSON ({exc})"]
    if summary is None or "rows" not in summary or summary["rows"] == rows:
        return []
    return [f"{SUMMARY_FILE} counts {summary['rows']} rows, the files hold {rows}"]


def report(result: Verification) -> str:
    """The lines `dscore verify` prints: one per problem, then the verdict."""
    verdict = (f"OK: {result.folder}: {result.shards} shards, {result.rows} rows" if result.ok
               else f"FAILED: {result.folder}: {len(result.problems)} problem(s)")
    return "\n".join([*result.problems, verdict])
