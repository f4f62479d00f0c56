"""What every N-best reader makes and shares: the columns of a hypothesis, a `Record` with its place in the
input, the `NBestError` that names the rows and the fix, and a list's or reference file opened (`open_file`)
or loaded as JSON (`load_json`). `nbest` (JSONL, Parquet, mlm-scoring's JSON, references) and `nbest_formats`
(the toolkits' lists) build their records from these; `nbest` makes the table of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Mapping

from ..errors import UserError
from .sources.lines import MAX_RECORD_BYTES, bounded_lines
from .storage import open_binary

UTT_ID = "utt_id"
HYP_ID = "hyp_id"
TEXT = "text"
SCORE = "score"
REF = "ref"
SEQ_LEN = "seq_len"
FEATURES = "features"  # Moses/Marian's feature list, an extra column where the format has one


class NBestError(UserError):
    """An N-best list or reference file cannot be used as given; the message names the rows and the fix."""


@dataclass(frozen=True)
class Record:
    """One input record and where it came from (for error messages)."""

    where: str
    fields: Mapping[str, Any]


def open_file(uri: str, seekable: bool) -> BinaryIO:
    """`open_binary`, with a missing or unreadable N-best or reference file as an `NBestError`."""
    try:
        return open_binary(uri, seekable)
    except OSError as exc:
        raise NBestError(
            f"cannot read {uri!r} ({exc.strerror or exc}): check the path of the N-best or reference file"
        ) from exc


def load_json(uri: str, what: str) -> dict:
    """The whole JSON document; a key repeated inside one object is an error (json would keep the last). `what`
    names what the file was read as (the format asked for, or told), which a file that is no JSON is not."""

    def pairs(items: list[tuple[str, Any]]) -> dict:
        keys = [k for k, _ in items]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise NBestError(f"{uri}: the key(s) {repeated!r} appear twice in one JSON object; each must be unique")
        return dict(items)

    with open_file(uri, seekable=False) as stream:
        try:
            document = json.load(stream, object_pairs_hook=pairs)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested deep
            hint = "; it holds a JSON object per line: JSONL (a .jsonl file, or --format jsonl)"
            hint = hint if isinstance(exc, json.JSONDecodeError) and _object_lines(exc) else ""
            raise NBestError(f"{uri} is not one JSON document ({exc}), which {what} is{hint}") from exc
    if not isinstance(document, dict):
        raise NBestError(f"{uri}: expected a JSON object {{utt_id: {{...}}}}, got {type(document).__name__}")
    return document


def _object_lines(exc: json.JSONDecodeError) -> bool:
    """Whether a document json could not read past its first value is an object per line (JSONL)."""
    if exc.msg != "Extra data":
        return False
    first = next((line for line in exc.doc.splitlines() if line.strip()), "")
    try:
        return isinstance(json.loads(first), dict)
    except (json.JSONDecodeError, RecursionError):
        return False


def numbered_lines(stream: BinaryIO, uri: str) -> Iterator[tuple[int, bytes]]:
    """(1-based number, line without its ending) of an N-best list or reference file, read in bounded pieces:
    a line over `MAX_RECORD_BYTES` is refused in one line, not read whole into memory."""
    for number, raw in bounded_lines(stream):
        if raw is None:
            raise NBestError(
                f"{uri} line {number} is over {MAX_RECORD_BYTES:,} bytes, the limit per line of an N-best list or "
                "reference file; check that the file is what it should be (one hypothesis or utterance per line)"
            )
        yield number, raw
