"""The teacher of a maskless student (`dscore train maskless`): a `dscore score` run's usable rows, read
and checked before any work, with what they must hold for the student's target."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...engine.model_files import TARGET_DISTRIBUTION, TARGET_SENTENCE
from ...errors import UserError
from ...io import schema as S
from ...io.output import ROWS_DIR, RUN_FILE, SUMMARY_FILE, OutputDir

if TYPE_CHECKING:
    from .maskless_job import StudentOptions

logger = logging.getLogger(__name__)

TEACHER_COLUMNS = (S.ID, S.TEXT, S.PLL, S.STATUS, S.N_TOKENS)
TEACHER_TOKENS = (S.TOKENS, S.TOKEN_LOGPROBS)
TEACHER_CONDITIONALS = (S.COND_IDS, S.COND_LOGPROBS, S.COND_REST)


@dataclass(frozen=True)
class Teacher:
    """A PLL scoring run's usable rows (ok, finite PLL: id, text, pll, n_tokens, and the per-token columns
    it has) and what it says of itself."""

    folder: str
    rows: pa.Table
    total: int
    split_chars: bool
    variant: str
    model: str | None

    @property
    def digest(self) -> str:
        """Identity of the targets: a different teacher in the same folder is a different run."""
        pairs = sorted(zip(self.rows[S.ID].to_pylist(), self.rows[S.PLL].to_pylist()))
        return hashlib.sha256("\n".join(f"{i}\t{p!r}" for i, p in pairs).encode()).hexdigest()

    def has(self, columns: tuple[str, ...]) -> bool:
        return all(c in self.rows.column_names for c in columns)


def read_teacher(folder: str) -> Teacher:
    """The teacher's rows, refused with what to do when the folder is no finished PLL run with usable rows."""
    out = OutputDir(folder)
    if not out.exists(out.root):
        raise UserError(f"teacher folder {folder!r} does not exist: pass the --output folder of a `dscore score` run")
    files = out.row_parts()
    if not files:
        raise UserError(
            f"teacher folder {folder!r} holds no scored rows ({ROWS_DIR}/*.parquet): pass the --output "
            "folder of a finished `dscore score` run"
        )
    try:
        run = out.read_json(RUN_FILE) or {}
    except ValueError as exc:
        raise UserError(f"{folder}/{RUN_FILE} is damaged ({exc}); score the teacher again") from exc
    if run.get("workload", "pll") != "pll":
        raise UserError(
            f"teacher folder {folder!r} holds a {run['workload']!r} run; the teacher must be a PLL run (`dscore score`)"
        )
    columns = pq.read_schema(files[0], filesystem=out.fs).names
    missing = [c for c in TEACHER_COLUMNS if c not in columns]
    if missing:
        raise UserError(
            f"the teacher's rows ({files[0]}) have no {', '.join(missing)} column(s) (they have "
            f"{', '.join(columns)}): pass the folder of a PLL run (`dscore score`)"
        )
    wanted = [*TEACHER_COLUMNS, *(c for c in (*TEACHER_TOKENS, *TEACHER_CONDITIONALS) if c in columns)]
    table = pq.read_table(files, filesystem=out.fs, columns=wanted)
    usable = pc.and_(pc.equal(table[S.STATUS], S.STATUS_OK), pc.is_finite(table[S.PLL]))
    rows = table.filter(pc.fill_null(usable, False))
    if rows.num_rows == 0:
        raise UserError(
            f"all {table.num_rows} rows of teacher folder {folder!r} are error rows (or have no PLL): "
            "nothing to learn from; check its `error` column"
        )
    if not out.exists(out.path(SUMMARY_FILE)):
        logger.warning(
            "teacher folder %s has no %s: its run may be unfinished (only the rows written are used)",
            folder,
            SUMMARY_FILE,
        )
    return Teacher(
        folder,
        rows.drop_columns([S.STATUS]),
        table.num_rows,
        bool(run.get("split_chars")),
        run.get("variant", "original"),
        run.get("model"),
    )


def check_teacher_has(teacher: Teacher, student: StudentOptions) -> None:
    """A per-token target needs the teacher's per-token terms, `distribution` its conditionals too."""
    if student.target != TARGET_SENTENCE and not teacher.has(TEACHER_TOKENS):
        raise UserError(
            f"--target {student.target} needs the teacher's per-token scores, and teacher folder "
            f"{teacher.folder!r} has none: score it with `dscore score --per-token`"
        )
    if student.target == TARGET_DISTRIBUTION and not teacher.has(TEACHER_CONDITIONALS):
        raise UserError(
            f"--target distribution needs the teacher's conditionals, and teacher folder {teacher.folder!r} "
            "has none: score it with `dscore score --per-token --conditionals K` (K >= the vocabulary "
            "for all of it; see docs/train.md)"
        )
