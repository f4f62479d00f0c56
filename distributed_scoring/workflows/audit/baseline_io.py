"""A baseline's files: a previous audit.json read back and checked (before any scoring, so that a bad
`--baseline` fails at once), the per-row figures written beside it (`row_stats.parquet`) read back, and
this run's per-row figures made from its scored rows, for the next run to be judged against.
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ...errors import UserError
from ...io import schema as S
from ...io.storage import filesystem, join, open_binary, storage_error
from .baseline import AUDIT_FILE, READABLE_VERSIONS
from .records import AuditRecord
from .row_stats import ROW_STATS_SCHEMA
from .verdicts import METRICS

logger = logging.getLogger(__name__)


def load_baseline(uri: str) -> tuple[AuditRecord, str]:
    """A previous audit.json (path or URI, or the folder holding it), checked for its schema version;
    returns it with the URI it was read from."""
    fs, path = filesystem(uri)
    if fs is not None:
        try:
            kind = fs.get_file_info(path).type
        except OSError as exc:
            raise storage_error(uri, exc, "read the baseline") from exc
        if kind == pafs.FileType.NotFound:
            raise UserError(f"baseline {uri!r} does not exist: pass a previous run's {AUDIT_FILE} or its folder")
        if kind == pafs.FileType.Directory:
            uri = join(uri, AUDIT_FILE)
    try:
        with open_binary(uri, seekable=False) as stream:
            data = json.loads(stream.read())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read baseline {uri!r}: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema_version") not in READABLE_VERSIONS:
        found = data.get("schema_version") if isinstance(data, dict) else type(data).__name__
        raise UserError(f"baseline {uri!r} has audit schema version {found!r}, expected one of {READABLE_VERSIONS}")
    missing = [k for k in ("signature", "overall", "partitions") if k not in data]
    if missing:
        raise UserError(
            f"baseline {uri!r} is not an audit.json: it lacks {missing}; pass a previous run's {AUDIT_FILE}"
        )
    problem = _malformed(data)
    if problem:
        raise UserError(f"baseline {uri!r} is malformed: {problem}; pass a previous run's {AUDIT_FILE} as written")
    return AuditRecord.from_json(data), uri


_SCOPE_FIGURES = ("rows", "error_rate", *METRICS)  # what `compare` reads of each scope


def _malformed(audit: dict) -> str | None:
    """What in an audit.json's signature and scopes `compare` could not read (a hand-edited or truncated
    file would otherwise end in a KeyError traceback after the whole snapshot was scored), or None."""
    signature = audit["signature"]
    scorers = signature if isinstance(signature, list) else [signature]
    if not all(
        isinstance(s, dict) and isinstance(s.get(S.MODEL), str) and isinstance(s.get(S.VARIANT), str) for s in scorers
    ):
        return f"`signature` must name the {S.MODEL} and {S.VARIANT} (found {signature!r:.80})"
    if not isinstance(audit["partitions"], dict):
        return f"`partitions` must be an object of scopes, found {type(audit['partitions']).__name__}"
    for name, scope in [("overall", audit["overall"]), *audit["partitions"].items()]:
        bad = [
            k for k in _SCOPE_FIGURES if not isinstance(scope, dict) or k not in scope or not _is_figure(scope[k], k)
        ]
        if bad:
            return f"scope {name!r} lacks numbers for {bad}"
    return None


def _is_figure(value: object, key: str) -> bool:
    """A number (not a bool); a PPPL may be null (a scope without scored tokens)."""
    if value is None:
        return key in METRICS
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_row_stats(audit_uri: str, audit: AuditRecord) -> pa.Table | None:
    """The baseline's per-row figures, from the file its audit.json names beside it; None for audits
    written before they existed (or whose file is gone), which leaves PPPL changes without an interval."""
    name = audit.row_stats
    if not name:
        return None
    uri = join(audit_uri.rsplit("/", 1)[0], name) if "/" in audit_uri else name
    fs, path = filesystem(uri)
    try:
        return pq.read_table(path, filesystem=fs, schema=ROW_STATS_SCHEMA)
    except (OSError, pa.ArrowInvalid) as exc:
        logger.warning("the baseline's per-row figures %s cannot be read (%s): PPPL changes are not judged", uri, exc)
        return None


def row_stats_table(batch: pa.RecordBatch | pa.Table, partitions: pa.Array) -> pa.Table:
    """Per-row figures of scored rows (ROW_STATS_SCHEMA); `partitions` holds each row's partition name."""
    ok = pc.equal(batch[S.STATUS], S.STATUS_OK)
    arrays = [
        batch[S.ID],
        partitions,
        ok,
        pc.if_else(ok, batch[S.PLL], pa.scalar(None, pa.float64())),
        pc.if_else(ok, batch[S.N_TOKENS], 0),
        pc.if_else(ok, batch[S.N_WORDS], 0),
    ]
    return pa.Table.from_arrays([a.cast(f.type) for a, f in zip(arrays, ROW_STATS_SCHEMA)], schema=ROW_STATS_SCHEMA)
