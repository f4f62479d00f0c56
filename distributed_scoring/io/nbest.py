"""N-best lists of a sequence model (ASR, MT) for rescoring, read into one validated table.

Every input shape becomes one table (`NBEST_SCHEMA`, one row per hypothesis):

- JSONL or Parquet, one record per hypothesis: `utt_id`, `hyp_id` (the sequence model's rank),
  `text`, `score` (its natural-log score), optional `ref` and `seq_len` (hypothesis length in the
  sequence model's own tokens, used only to length-normalise `score`).
- The ESPnet-style JSON of Shin et al. (2019) that mlm-scoring reads (`mlm-scoring`):
  `{utt_id: {"ref": "...", "hyp_1": {"score": s, "text": "..."}, "hyp_2": {...}, ...}}`; keys of an
  utterance other than `ref` and `hyp_<rank>` are ignored.
- The lists of fairseq, Moses/Marian, ESPnet, NeMo and Kaldi as those toolkits write them
  (`nbest_formats`); Moses/Marian lists add a `features` column (their feature list, kept to be
  written back).
- References may instead come from a separate file (`read_references`): JSONL or Parquet with
  `utt_id` and `ref`, a TSV of `utt_id<TAB>ref` lines, the mlm-scoring JSON, or text: one line per
  utterance in the list's order, or Kaldi-style `utt_id ref` lines.

`--format auto` (`nbest_formats.detect`) tells the format by content; `.json` stays mlm-scoring's JSON
unless it is ESPnet1's (`{"utts": ...}`). Nothing is guessed: a malformed record (missing or non-numeric
score, missing or blank text, a duplicate (utt_id, hyp_id), conflicting references) stops the read with
one error that names every problem's place (first ones shown) and what to do. Texts are stripped of
surrounding whitespace (the ESPnet lists start every hypothesis with a space), and the stripped text is
what LMs score and what `unique_texts` returns. Rows come out grouped by utterance, in order of each
utterance's first appearance in the input (by numeric id for fairseq and Moses/Marian), hypotheses by rank.
"""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa

from .inputs import detect_format
from .nbest_records import (
    FEATURES,
    HYP_ID,
    REF,
    SCORE,
    SEQ_LEN,
    TEXT,
    UTT_ID,
    NBestError,
    Record,
    load_json,
    numbered_lines,
    open_file,
)
from .storage import COMPRESSIONS, is_seekable

if TYPE_CHECKING:
    from .nbest_formats import FormatOptions

NBEST_SCHEMA = pa.schema(
    [
        pa.field(UTT_ID, pa.string(), nullable=False),
        pa.field(HYP_ID, pa.int32(), nullable=False),  # rank in the sequence model's list (1 = its best)
        pa.field(TEXT, pa.string(), nullable=False),
        pa.field(SCORE, pa.float64(), nullable=False),  # the sequence model's log-score
        pa.field(REF, pa.string()),  # the utterance's reference; null where none was given
        pa.field(SEQ_LEN, pa.int32()),  # length in the sequence model's tokens; null where not given
    ]
)

FEATURES_FIELD = pa.field(FEATURES, pa.string())

NBEST_FORMATS = ("auto", "jsonl", "parquet", "fairseq", "marian", "moses", "espnet", "nemo", "kaldi", "mlm-scoring")
REFERENCE_FORMATS = ("mlm-scoring", "jsonl", "parquet", "tsv", "text")

_HYP_KEY = re.compile(r"hyp_(\d+)")
MLM_SCORING_JSON = 'mlm-scoring\'s N-best JSON (one object {utt_id: {"ref", "hyp_1": {"score", "text"}, ...}})'
MLM_SCORING_REFERENCES = 'a .json reference file (mlm-scoring\'s: one object {utt_id: {"ref": ...}})'
_SHOWN = 10  # problems listed in one error message
_INT32_MAX = 2**31 - 1  # `hyp_id` and `seq_len` are int32 columns


def read_nbest(
    uri: str, references: str | None = None, fmt: str = "auto", options: FormatOptions | None = None
) -> pa.Table:
    """Read an N-best list (and optionally a separate reference file) into a `NBEST_SCHEMA` table.

    `fmt` is one of `NBEST_FORMATS`; `auto` tells it by content (`nbest_formats.detect`). `options` holds
    what a toolkit's format cannot say for itself (Kaldi's acoustic scale, NeMo's beam size).
    """
    from . import nbest_formats

    fmt = resolve_format(uri, fmt)
    if fmt == "mlm-scoring":
        records: Iterable[Record] = _espnet_hypotheses(load_json(uri, MLM_SCORING_JSON), uri)
    elif fmt == "jsonl":
        records = _jsonl_records(uri)
    elif fmt == "parquet":
        records = _parquet_records(uri)
    else:
        options = options or nbest_formats.FormatOptions()
        count = reference_count(references) if fmt == "nemo" and references and not options.beam_size else None
        records = nbest_formats.toolkit_records(uri, fmt, options, count)
    table = nbest_table(records, uri)
    if references is not None:
        utt_ids = list(dict.fromkeys(table.column(UTT_ID).to_pylist()))
        table = with_references(table, read_references(references, utt_ids=utt_ids), references)
    return table


def resolve_format(uri: str, fmt: str = "auto") -> str:
    """`fmt` checked against `NBEST_FORMATS`, `auto` told by the list's content."""
    from .nbest_formats import detect

    if fmt not in NBEST_FORMATS:
        raise NBestError(f"N-best format {fmt!r} is not one of {', '.join(NBEST_FORMATS)}")
    return detect(uri) if fmt == "auto" else fmt


def read_references(uri: str, fmt: str | None = None, utt_ids: Sequence[str] = ()) -> dict[str, str]:
    """utt_id -> reference text from a file in one of `REFERENCE_FORMATS` (stripped like hypotheses).

    A text file gives one reference per line: Kaldi-style `utt_id ref` when every line starts with one of
    `utt_ids` (the N-best list's utterances, in order), else the i-th line is the i-th utterance's.
    """
    fmt = fmt or _reference_format(uri)
    if fmt == "mlm-scoring":
        records: Iterable[Record] = _espnet_references(load_json(uri, MLM_SCORING_REFERENCES), uri)
    elif fmt == "jsonl":
        records = _jsonl_records(uri)
    elif fmt == "parquet":
        records = _parquet_records(uri)
    elif fmt == "tsv":
        records = _tsv_references(uri)
    elif fmt == "text":
        records = _text_references(uri, utt_ids)
    else:
        raise NBestError(f"reference format {fmt!r} is not one of {REFERENCE_FORMATS}")
    refs: dict[str, str] = {}
    first_seen: dict[str, str] = {}
    problems: list[str] = []
    for record in records:
        utt_id, ref = _utt_id(record.fields.get(UTT_ID)), record.fields.get(REF)
        if utt_id is None:
            problems.append(f"{record.where}: utt_id is missing or not a string")
        elif not isinstance(ref, str):
            problems.append(f"{record.where}: ref of utterance {utt_id!r} is missing or not a string")
        elif utt_id in refs:
            problems.append(f"{record.where}: utterance {utt_id!r} already has a reference ({first_seen[utt_id]})")
        else:
            refs[utt_id], first_seen[utt_id] = ref.strip(), record.where
    _raise_if(problems, uri, "reference records", "give each utterance exactly one string `ref`")
    return refs


def nbest_table(records: Iterable[Mapping[str, Any] | Record], source: str = "N-best list") -> pa.Table:
    """Validate hypothesis records (dicts with the `NBEST_SCHEMA` fields) into a table.

    This is what every reader ends with; in-memory lists (tests, generated data) use it directly.
    An utterance's reference may sit on any of its rows; rows that carry one must agree.
    """
    rows: list[dict] = []
    problems: list[str] = []
    for index, record in enumerate(records):
        if not isinstance(record, Record):
            record = Record(f"record {index + 1}", record)
        row, problem = _hypothesis_row(record)
        if problem:
            problems.append(f"{record.where}: {problem}")
        else:
            row["_where"] = record.where
            rows.append(row)
    by_utt: dict[str, list[dict]] = {}
    for row in rows:
        by_utt.setdefault(row[UTT_ID], []).append(row)
    for utt_id, hyps in by_utt.items():
        problems += _utterance_problems(utt_id, hyps)
    _raise_if(problems, source, "hypothesis records", "fix or drop these records; nothing was rescored")
    ordered = [row for hyps in by_utt.values() for row in sorted(hyps, key=lambda r: r[HYP_ID])]
    schema = NBEST_SCHEMA.append(FEATURES_FIELD) if any(row[FEATURES] is not None for row in ordered) else NBEST_SCHEMA
    columns = {name: [row[name] for row in ordered] for name in schema.names}
    return pa.Table.from_pydict(columns, schema=schema)


def with_references(table: pa.Table, refs: Mapping[str, str], source: str) -> pa.Table:
    """Fill the `ref` column from `refs`; a reference already in the table must agree with the file's.

    References for utterances not in the table are ignored (a reference file may cover a whole corpus).
    """
    utt_ids = table.column(UTT_ID).to_pylist()
    current = table.column(REF).to_pylist()
    problems = []
    for utt_id, ref in sorted({(u, r) for u, r in zip(utt_ids, current) if r is not None and u in refs}):
        if refs[utt_id] != ref:
            problems.append(f"utterance {utt_id!r}: the N-best list says {ref!r}, {source} says {refs[utt_id]!r}")
    _raise_if(problems, source, "references", "keep the reference in one place, or make both agree")
    merged = pa.array([refs.get(u, r) for u, r in zip(utt_ids, current)], pa.string())
    return table.set_column(NBEST_SCHEMA.get_field_index(REF), NBEST_SCHEMA.field(REF), merged)


def require_references(table: pa.Table, name: str) -> None:
    """Refuse a table where some utterance has no reference (the metric needs one for every utterance)."""
    missing = sorted({u for u, r in zip(table.column(UTT_ID).to_pylist(), table.column(REF).to_pylist()) if r is None})
    if missing:
        shown = ", ".join(repr(u) for u in missing[:_SHOWN]) + (" ..." if len(missing) > _SHOWN else "")
        raise NBestError(
            f"{name}: {len(missing)} utterances have no reference ({shown}); WER/BLEU need one for every "
            "utterance: add a `ref` to their rows, or pass a reference file with `utt_id` and `ref`"
        )


def unique_texts(*tables: pa.Table) -> list[str]:
    """Every distinct hypothesis text of the tables, sorted: what each LM must score once."""
    texts: set[str] = set()
    for table in tables:
        texts.update(table.column(TEXT).to_pylist())
    return sorted(texts)


def _hypothesis_row(record: Record) -> tuple[dict, str | None]:
    """The validated row of one record, or what is wrong with it."""
    f = record.fields
    utt_id = _utt_id(f.get(UTT_ID))
    if utt_id is None:
        return {}, f"`{UTT_ID}` is missing or not a string (got {f.get(UTT_ID)!r})"
    hyp_id = f.get(HYP_ID)
    if isinstance(hyp_id, float) and hyp_id.is_integer():
        hyp_id = int(hyp_id)
    if not isinstance(hyp_id, int) or isinstance(hyp_id, bool):
        return {}, f"utterance {utt_id!r}: `{HYP_ID}` is missing or not an integer rank (got {hyp_id!r})"
    if not 1 <= hyp_id <= _INT32_MAX:
        return {}, (
            f"utterance {utt_id!r}: `{HYP_ID}` {hyp_id} is not a rank: ranks count from 1 (the sequence "
            "model's best); renumber the list's hypotheses 1, 2, ..."
        )
    where = f"utterance {utt_id!r} hypothesis {hyp_id}"
    text = f.get(TEXT)
    if not isinstance(text, str):
        return {}, f"{where}: `{TEXT}` is missing or not a string (got {text!r})"
    if not text.strip():
        return {}, f"{where}: `{TEXT}` is empty; LMs cannot score an empty hypothesis, drop it"
    if "\n" in text.strip() or "\r" in text.strip():
        return {}, f"{where}: `{TEXT}` holds a line break; one hypothesis must be one line"
    score = f.get(SCORE)
    if not isinstance(score, (int, float)) or isinstance(score, bool):
        return {}, f"{where}: `{SCORE}` is missing or not a number (got {score!r})"
    if not math.isfinite(score):
        return {}, f"{where}: `{SCORE}` is {score}, not a finite log-score"
    ref = f.get(REF)
    if ref is not None and not isinstance(ref, str):
        return {}, f"{where}: `{REF}` is not a string (got {ref!r})"
    seq_len = f.get(SEQ_LEN)
    if seq_len is not None and (
        not isinstance(seq_len, int) or isinstance(seq_len, bool) or not 0 <= seq_len <= _INT32_MAX
    ):
        return {}, f"{where}: `{SEQ_LEN}` is not a non-negative integer (got {seq_len!r})"
    features = f.get(FEATURES)
    if features is not None and not isinstance(features, str):
        return {}, f"{where}: `{FEATURES}` is not a string (got {features!r})"
    row = {UTT_ID: utt_id, HYP_ID: hyp_id, TEXT: text.strip(), SCORE: float(score), REF: ref, SEQ_LEN: seq_len}
    row[FEATURES] = features
    if ref is not None:
        row[REF] = ref.strip()
    return row, None


def _utt_id(value: Any) -> str | None:
    """Utterance ids are strings; integer ids (Parquet, JSON) are taken as their decimal string."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value if isinstance(value, str) and value else None


def _utterance_problems(utt_id: str, hyps: list[dict]) -> list[str]:
    """Duplicate ranks and conflicting references within one utterance; fills its reference on every row."""
    problems = []
    seen: dict[int, str] = {}
    for row in hyps:
        if row[HYP_ID] in seen:
            problems.append(
                f"{row['_where']}: utterance {utt_id!r} already has hypothesis {row[HYP_ID]} "
                f"({seen[row[HYP_ID]]}); give each hypothesis of an utterance its own hyp_id"
            )
        seen.setdefault(row[HYP_ID], row["_where"])
    refs = {row[REF] for row in hyps if row[REF] is not None}
    if len(refs) > 1:
        problems.append(f"utterance {utt_id!r}: its rows give {len(refs)} different references {sorted(refs)!r}")
    elif refs:
        (ref,) = refs
        for row in hyps:
            row[REF] = ref
    return problems


def _raise_if(problems: list[str], source: str, what: str, fix: str) -> None:
    if not problems:
        return
    shown = "; ".join(problems[:_SHOWN])
    more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
    raise NBestError(f"{source}: {len(problems)} problems in the {what}: {shown}{more}. To fix: {fix}")


def _reference_format(uri: str) -> str:
    """By name: `.json` is mlm-scoring's JSON, `.jsonl`, `.parquet`, `.tsv` theirs, anything else text lines."""
    suffixes = [s.lower() for s in PurePosixPath(uri).suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes.pop()
    fmt = "mlm-scoring" if suffixes and suffixes[-1] == ".json" else detect_format(uri)
    if fmt not in REFERENCE_FORMATS:
        raise NBestError(
            f"cannot read references from {uri!r} ({fmt}); use a .json (mlm-scoring), .jsonl, .parquet or .tsv "
            "file, or text with one reference per line"
        )
    return fmt


def reference_count(uri: str) -> int:
    """How many utterances a reference file covers (what groups a NeMo list's beams)."""
    if _reference_format(uri) == "text":
        return sum(1 for _ in _reference_lines(uri))
    return len(read_references(uri))


def _espnet_hypotheses(document: dict, uri: str) -> Iterator[Record]:
    for utt_id, entry in document.items():
        if not isinstance(entry, dict):
            raise NBestError(f"{uri}: utterance {utt_id!r} is a {type(entry).__name__}, not an object of hyp_N entries")
        hyp_keys = [k for k in entry if k.startswith("hyp")]
        if not hyp_keys:
            raise NBestError(f"{uri}: utterance {utt_id!r} has no hyp_N entries")
        for key in hyp_keys:
            match = _HYP_KEY.fullmatch(key)
            where = f"{uri} utterance {utt_id!r} {key}"
            if not match:
                raise NBestError(f"{where}: hypothesis keys must read hyp_<rank> (hyp_1, hyp_2, ...)")
            hyp = entry[key]
            if not isinstance(hyp, dict):
                raise NBestError(f"{where}: expected an object with `score` and `text`, got {hyp!r}")
            fields = {UTT_ID: utt_id, HYP_ID: int(match.group(1)), TEXT: hyp.get(TEXT), SCORE: hyp.get(SCORE)}
            yield Record(where, {**fields, REF: entry.get(REF)})


def _espnet_references(document: dict, uri: str) -> Iterator[Record]:
    for utt_id, entry in document.items():
        ref = entry.get(REF) if isinstance(entry, dict) else None
        yield Record(f"{uri} utterance {utt_id!r}", {UTT_ID: utt_id, REF: ref})


def _jsonl_records(uri: str) -> Iterator[Record]:
    with open_file(uri, seekable=False) as stream:
        for number, raw in numbered_lines(stream, uri):
            if not raw.strip():
                continue
            where = f"{uri} line {number}"
            try:
                fields = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested deep
                raise NBestError(f"{where} is not a JSON record ({exc}); JSONL holds one JSON object per line") from exc
            if not isinstance(fields, dict):
                raise NBestError(f"{where} is a JSON {type(fields).__name__}, not an object")
            yield Record(where, fields)


def _parquet_records(uri: str) -> Iterator[Record]:
    import pyarrow.parquet as pq

    with open_file(uri, seekable=True) as stream:
        source = stream if is_seekable(uri) else io.BytesIO(stream.read())
        table = pq.read_table(source)
    for number, fields in enumerate(table.to_pylist(), start=1):
        yield Record(f"{uri} row {number}", fields)


def _reference_lines(uri: str) -> Iterator[tuple[int, str]]:
    with open_file(uri, seekable=False) as stream:
        for number, raw in numbered_lines(stream, uri):
            yield number, raw.decode("utf-8").rstrip("\r\n")


def _text_references(uri: str, utt_ids: Sequence[str]) -> Iterator[Record]:
    """Kaldi-style `utt_id ref` lines when every line starts with an utterance of the list, else one
    reference per line in the list's utterance order (the count must match). Lines that all start with what
    reads as an id, not all of them the list's, are refused: read by position, each id would become its
    reference's first word."""
    lines = list(_reference_lines(uri))
    known = set(utt_ids)
    firsts = [line.split(maxsplit=1)[0] for _, line in lines if line.strip()]
    unknown = [w for w in firsts if w not in known]
    if lines and not unknown:
        for number, line in lines:
            if line.strip():
                utt_id, _, ref = line.strip().partition(" ")
                yield Record(f"{uri} line {number}", {UTT_ID: utt_id, REF: ref})
        return
    if _like_ids(firsts):
        raise NBestError(
            f"{uri}: its lines start with utterance ids (Kaldi's `utt_id reference`), but {len(unknown)} of "
            f"{len(firsts)} are not utterances of the N-best list (e.g. {unknown[0]!r}"
            + (f"; the list's are like {utt_ids[0]!r}" if utt_ids else "")
            + "): give each line the id its utterance has in the list, or, if those words belong to the "
            "references, give them as a TSV of `utt_id<TAB>reference`"
        )
    if len(lines) != len(utt_ids):
        raise NBestError(
            f"{uri}: {len(lines)} reference lines for {len(utt_ids)} utterances; give one line per utterance in "
            "the N-best list's order, or Kaldi-style `utt_id reference` lines"
        )
    for (number, line), utt_id in zip(lines, utt_ids):
        yield Record(f"{uri} line {number}", {UTT_ID: utt_id, REF: line})


def _like_ids(words: list[str]) -> bool:
    """Whether the first words of a text's lines read as keys: each holds a digit and none repeats (as Kaldi's
    `1272-128104-0000` do), where the first words of plain references nearly never all hold a digit."""
    return bool(words) and len(set(words)) == len(words) and all(any(c.isdigit() for c in w) for w in words)


def _tsv_references(uri: str) -> Iterator[Record]:
    with open_file(uri, seekable=False) as stream:
        for number, raw in numbered_lines(stream, uri):
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.strip() or (number == 1 and line == f"{UTT_ID}\t{REF}"):
                continue
            utt_id, tab, ref = line.partition("\t")
            if not tab:
                raise NBestError(f"{uri} line {number}: expected `utt_id<TAB>reference`, found no tab")
            yield Record(f"{uri} line {number}", {UTT_ID: utt_id, REF: ref})
