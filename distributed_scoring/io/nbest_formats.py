"""N-best lists as sequence-model toolkits write them, read into `nbest_records` records and written back rescored.

`nbest.read_nbest` reads JSONL, Parquet and mlm-scoring's JSON itself and hands every toolkit format to
`toolkit_records` here; `detect` tells a file's format by its content (`--format auto`). Each format keeps
its toolkit's meaning of the fields, turned into the table's: `utt_id` a string, `hyp_id` the rank from 1
in the toolkit's own order, `score` a natural-log score (fairseq's base-2 scores are multiplied by ln 2,
Kaldi's costs negated), `ref` where the format carries the reference.

- fairseq (`fairseq-generate`): `S-<id>`/`T-<id>`/`H-<id>`/`D-<id>`/`P-<id>` lines (tab-separated); `H-`
  and `D-` carry the base-2 score, `D-` the detokenised text (used when present), `T-` the reference;
  other lines (the log, `Generate test with beam=...`) are skipped. Utterances by numeric id.
- moses / marian: `id ||| text ||| features ||| total`, the id a 0-based source line number; `total` is
  the score, the feature list is kept (`features` column) to be written back.
- espnet: an ESPnet2 decoding folder of `1best_recog/`, `2best_recog/`, ... each with Kaldi-style `text`
  and `score` (`str(hyp.score)`, a `tensor(...)` repr), or ESPnet1's recognition JSON
  `{"utts": {utt: {"output": [{"rec_text", "score", "text" (the reference)}, ...]}}}`.
- nemo: `text<TAB>score` lines, one beam of candidates per utterance, no ids: the beam size comes from
  `FormatOptions.beam_size` or from the number of references.
- kaldi: `utt-N text` lines with `lm_cost` and `ac_cost` beside them (`utt-N cost`, nbest-to-linear's
  archives); score = -(acwt * ac_cost + lm_cost), Kaldi's total cost at acoustic scale `acwt`.

`rescored_files` writes a list back in its own format with the rescored totals and order, so that the
toolkit's own scripts read the rescoring as they read the list (docs/rescore.md, "Rescored lists").
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

import pyarrow as pa

from ..options import check, option
from .nbest_records import (
    FEATURES,
    HYP_ID,
    REF,
    SCORE,
    TEXT,
    UTT_ID,
    NBestError,
    Record,
    load_json,
    numbered_lines,
    open_file,
)
from .storage import COMPRESSIONS, scheme

TOOLKIT_FORMATS = ("fairseq", "marian", "moses", "espnet", "nemo", "kaldi")
LN2 = math.log(2.0)

_FAIRSEQ_LINE = re.compile(r"([STHDPAIE])-(\d+)(?:_\d+)?\t(.*)")
_FAIRSEQ_LIKE = re.compile(r"[STHDPAIE]-\d")  # a line that claims to be fairseq's, well formed or not
_TENSOR = re.compile(r"tensor\(\s*([^,)\s]+)")  # str(torch.tensor(x)), with or without device=
_KALDI_KEY = re.compile(r"(.+)-(\d+)")
_RECOG = re.compile(r"(\d+)best_recog")
_SNIFF_LINES = 200  # lines read to tell a text format
ESPNET1_JSON = 'ESPnet1\'s N-best JSON (one object {"utts": {utt_id: {"output": [...]}}})'
MAX_ACWT = 100.0  # Kaldi decodes at 1/LMWT (about 0.05 to 1); past 100 the LM cost no longer counts


@dataclass(frozen=True)
class FormatOptions:
    """What a format cannot say for itself: Kaldi's acoustic scale, and NeMo's beam size (each declared with
    its flag, `dscore rescore`'s)."""

    kaldi_acwt: float = option(
        1.0,
        "acoustic scale of Kaldi n-best lists: score = -(acwt * ac_cost + lm_cost) (default {default}; Kaldi "
        "recipes decode at 1/LMWT, e.g. 0.1)",
        low=0,
        high=MAX_ACWT,
        above=True,
    )
    beam_size: int | None = option(
        None,
        "candidates per utterance of a NeMo beam TSV (which has no ids; else told from the references' count)",
        low=1,
        type=int,
    )

    def __post_init__(self) -> None:
        check(self)


def toolkit_records(uri: str, fmt: str, options: FormatOptions, references: int | None = None) -> Iterator[Record]:
    """The hypothesis records of a toolkit's N-best list; `references` (how many) can group NeMo's beams."""
    if fmt == "fairseq":
        return _fairseq(uri)
    if fmt in ("marian", "moses"):
        return _moses(uri)
    if fmt == "espnet":
        return _espnet2(uri) if _is_dir(uri) else _espnet1(uri)
    if fmt == "nemo":
        return _nemo(uri, options.beam_size, references)
    if fmt == "kaldi":
        return _kaldi(uri, options.kaldi_acwt)
    raise NBestError(f"N-best format {fmt!r} is not one of {TOOLKIT_FORMATS}")


def detect(uri: str) -> str:
    """The format of an N-best list by its content (`.jsonl` and `.parquet` by name).

    Refused in one line when no format, or more than one, reads the file: `--format` then says which.
    """
    if _is_dir(uri):
        if (Path(uri) / "1best_recog").is_dir():
            return "espnet"
        if _has_costs(uri):
            return "kaldi"
        raise NBestError(
            f"cannot tell the format of the folder {uri}: neither an ESPnet2 decoding folder (1best_recog/) nor "
            "a Kaldi n-best folder (text, lm_cost, ac_cost); name the format with --format"
        )
    suffix = _suffix(uri)
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    lines = _sample(uri)
    if lines and lines[0].lstrip().startswith("{"):
        return _json_kind(uri, lines[0])
    kinds: dict[str, int] = {}  # each kind of line seen -> the first line of that kind
    for number, line in enumerate(lines, start=1):
        kinds.setdefault(_line_kind(line) or "", number)
    kinds.pop("", None)
    if len(kinds) > 1:
        shown = ", ".join(f"line {number} is {kind}" for kind, number in kinds.items())
        raise NBestError(f"{uri} mixes N-best formats ({shown}); one list holds one format")
    matching = list(kinds)
    if _looks_kaldi(uri, lines) and kinds.keys() <= {"nemo"}:
        matching.append("kaldi")
    if len(matching) == 1:
        return matching[0]
    if not matching:
        raise NBestError(
            f"cannot tell the format of {uri}: its first lines are none of fairseq-generate's output, "
            "Moses/Marian `id ||| text ||| features ||| total`, NeMo's `text<TAB>score`, Kaldi's `utt-N text` "
            "(with lm_cost and ac_cost beside it), JSON or JSONL; name the format with --format"
        )
    raise NBestError(
        f"{uri} reads as more than one N-best format ({', '.join(matching)}); name the right one with --format"
    )


def _sample(uri: str) -> list[str]:
    lines = []
    for _, line in _lines(uri):
        if line.strip():
            lines.append(line)
        if len(lines) >= _SNIFF_LINES:
            break
    return lines


def _json_kind(uri: str, first: str) -> str:
    """JSONL (one record per line, with `utt_id`), ESPnet1's JSON (`utts`) or mlm-scoring's JSON."""
    try:
        record = json.loads(first)
    except (json.JSONDecodeError, RecursionError):  # not a JSONL record: the reader says why
        record = None
    if isinstance(record, dict) and UTT_ID in record:
        return "jsonl"
    document = load_json(uri, "an mlm-scoring or ESPnet1 N-best JSON, as its first line, opening an object, says")
    return "espnet" if _is_espnet1(document) else "mlm-scoring"


def _line_kind(line: str) -> str | None:
    """The format one line is written in, where a line can tell: fairseq's `X-id<TAB>`, Moses's (and
    Marian's) `id ||| text ||| features ||| total`, NeMo's `text<TAB>score`; None for any other line."""
    if _FAIRSEQ_LINE.fullmatch(line):
        return "fairseq"
    parts = line.split(" ||| ")
    if len(parts) == 4 and parts[0].strip().isdigit():
        return "moses"  # the format is Moses's; Marian writes the same, and both read and write alike
    if line.count("\t") == 1 and _is_number(line.split("\t")[1]):
        return "nemo"
    return None


def _looks_kaldi(uri: str, lines: list[str]) -> bool:
    return (
        bool(lines)
        and _has_costs(posixpath.dirname(uri) or ".")
        and all(_KALDI_KEY.fullmatch(line.split(maxsplit=1)[0]) for line in lines)
    )


def _fairseq(uri: str) -> Iterator[Record]:
    """fairseq_cli/generate.py: per sample `S-`, `T-`, then per hypothesis `H-id<TAB>score<TAB>text`,
    `D-` (the same score, detokenised text), `P-` (positional scores), optional `A-`/`I-`/`E-`."""
    hyps: dict[int, list[dict]] = {}
    refs: dict[int, str] = {}
    detok: dict[int, int] = {}  # D- lines seen per id: the k-th belongs to the k-th H- line
    for number, line in _lines(uri):
        where = f"{uri} line {number}"
        match = _FAIRSEQ_LINE.fullmatch(line)
        if match is None:
            if _FAIRSEQ_LIKE.match(line):
                raise NBestError(f"{where}: a fairseq line must read `<kind>-<id><TAB>...`, got {line[:80]!r}")
            if _line_kind(line):
                raise NBestError(f"{where} is a {_line_kind(line)} line in a fairseq list; one list holds one format")
            continue  # fairseq's log lines
        kind, sid, rest = match.group(1), int(match.group(2)), match.group(3)
        if kind == "T":
            refs[sid] = rest
        elif kind in "HD":
            score, tab, text = rest.partition("\t")
            if not tab:
                raise NBestError(f"{where}: expected `{kind}-{sid}<TAB>score<TAB>text`, found one field")
            fields = {SCORE: _tensor_number(score, where) * LN2, TEXT: text, "where": where}
            if kind == "H":
                hyps.setdefault(sid, []).append(fields)
            else:
                k = detok.get(sid, 0)
                if k >= len(hyps.get(sid, [])):
                    raise NBestError(f"{where}: a D- line of sample {sid} before its H- line")
                hyps[sid][k][TEXT] = text
                detok[sid] = k + 1
    if not hyps:
        raise NBestError(f"{uri}: no `H-` lines; a fairseq list is fairseq-generate's output (without --quiet)")
    for sid in sorted(hyps):
        for rank, h in enumerate(hyps[sid], start=1):
            fields = {UTT_ID: str(sid), HYP_ID: rank, TEXT: h[TEXT], SCORE: h[SCORE], REF: refs.get(sid)}
            yield Record(h["where"], fields)


def _moses(uri: str) -> Iterator[Record]:
    """Moses's n-best lines `id ||| text ||| features ||| total` (Marian writes the same), grouped by id."""
    by_id: dict[int, list[Record]] = {}
    for number, line in _lines(uri):
        if not line.strip():
            continue
        where = f"{uri} line {number}"
        parts = line.split("|||")
        if len(parts) != 4 or not parts[0].strip().isdigit():
            raise NBestError(f"{where}: expected `id ||| text ||| features ||| total`, got {line[:80]!r}")
        sid = int(parts[0])
        rank = len(by_id.setdefault(sid, [])) + 1
        fields = {UTT_ID: str(sid), HYP_ID: rank, TEXT: parts[1], SCORE: _number(parts[3], where)}
        by_id[sid].append(Record(where, {**fields, FEATURES: parts[2].strip()}))
    for sid in sorted(by_id):
        yield from by_id[sid]


def _espnet2(uri: str) -> Iterator[Record]:
    """espnet2/bin/asr_inference.py: `{n}best_recog/text` (`key text`) and `{n}best_recog/score`
    (`key str(hyp.score)`), utterances in the order of 1best_recog/text."""
    ranks = sorted(int(m.group(1)) for p in Path(uri).iterdir() if (m := _RECOG.fullmatch(p.name)))
    order: dict[str, int] = {}
    records: list[tuple[int, int, Record]] = []
    for rank in ranks:
        folder = posixpath.join(uri, f"{rank}best_recog")
        scores = dict(_kaldi_table(posixpath.join(folder, "score"), _tensor_number))
        for where, key, text in _kaldi_text(posixpath.join(folder, "text")):
            if key not in scores:
                raise NBestError(f"{where}: utterance {key!r} has no line in {folder}/score")
            order.setdefault(key, len(order))
            records.append(
                (order[key], rank, Record(where, {UTT_ID: key, HYP_ID: rank, TEXT: text, SCORE: scores[key][1]}))
            )
    for _, _, record in sorted(records, key=lambda r: r[:2]):
        yield record


def _espnet1(uri: str) -> Iterator[Record]:
    """espnet/asr/asr_utils.py add_results_to_json: per utterance an `output` list, one entry per
    hypothesis, with `rec_text` (tokens joined, `<space>` a space, `<eos>` at the end), `score` and the
    reference `text`. `<eos>` is dropped and sentencepiece's `▁` read as a space."""
    document = load_json(uri, ESPNET1_JSON)
    if not _is_espnet1(document):
        raise NBestError(f'{uri}: expected ESPnet1\'s recognition JSON {{"utts": {{utt: {{"output": [...]}}}}}}')
    for utt_id, entry in document["utts"].items():
        outputs = entry.get("output") if isinstance(entry, dict) else None
        if not isinstance(outputs, list):
            raise NBestError(f"{uri} utterance {utt_id!r}: expected an `output` list of hypotheses")
        for rank, out in enumerate(outputs, start=1):
            where = f"{uri} utterance {utt_id!r} output {rank}"
            if not isinstance(out, dict):
                raise NBestError(f"{where}: expected an object with `rec_text` and `score`")
            text = out.get("rec_text")
            if isinstance(text, str):
                text = text.replace("<eos>", "").replace("\u2581", " ")
            yield Record(
                where, {UTT_ID: utt_id, HYP_ID: rank, TEXT: text, SCORE: out.get("score"), REF: out.get("text")}
            )


def _nemo(uri: str, beam_size: int | None, references: int | None) -> Iterator[Record]:
    """NeMo's eval_beamsearch_ngram.py `--preds_output_folder` TSV: `text<TAB>score` per candidate, each
    utterance's beam in turn; utterance ids are 0-based positions."""
    rows = []
    for number, line in _lines(uri):
        if not line.strip():
            continue
        where = f"{uri} line {number}"
        text, tab, score = line.rpartition("\t")
        if not tab:
            raise NBestError(f"{where}: expected `text<TAB>score`, found no tab")
        rows.append((where, text, _number(score, where)))
    beam = beam_size or _beam_from_references(uri, len(rows), references)
    if len(rows) % beam:
        raise NBestError(
            f"{uri}: {len(rows)} candidates do not split into beams of {beam}; give the beam size the list was "
            "decoded with (--beam-size), every utterance must have that many candidates"
        )
    for index, (where, text, score) in enumerate(rows):
        yield Record(where, {UTT_ID: str(index // beam), HYP_ID: index % beam + 1, TEXT: text, SCORE: score})


def _beam_from_references(uri: str, candidates: int, references: int | None) -> int:
    if not references:
        raise NBestError(
            f"{uri}: a NeMo beam list has no utterance ids, so its beams cannot be told apart; pass --beam-size N "
            "(the --beam_width it was decoded with) or a reference file with one line per utterance"
        )
    if candidates % references:
        raise NBestError(
            f"{uri}: {candidates} candidates for {references} references is not a whole beam per utterance; "
            "pass --beam-size N"
        )
    return candidates // references


def _kaldi(uri: str, acwt: float) -> Iterator[Record]:
    """Kaldi n-best (nbest-to-linear's archives, words through int2sym.pl): `utt-N words`, with `lm_cost`
    and `ac_cost` beside it; score = -(acwt * ac_cost + lm_cost)."""
    text_file = posixpath.join(uri, "text") if _is_dir(uri) else uri
    folder = posixpath.dirname(text_file) or "."
    lm = dict(_kaldi_table(posixpath.join(folder, "lm_cost"), _number))
    ac = dict(_kaldi_table(posixpath.join(folder, "ac_cost"), _number))
    for where, key, text in _kaldi_text(text_file):
        match = _KALDI_KEY.fullmatch(key)
        if match is None:
            raise NBestError(f"{where}: a Kaldi n-best key reads `<utt>-<rank>`, got {key!r}")
        missing = [name for name, costs in (("lm_cost", lm), ("ac_cost", ac)) if key not in costs]
        if missing:
            raise NBestError(f"{where}: {key!r} has no line in {' or '.join(f'{folder}/{m}' for m in missing)}")
        score = -(acwt * ac[key][1] + lm[key][1])
        yield Record(where, {UTT_ID: match.group(1), HYP_ID: int(match.group(2)), TEXT: text, SCORE: score})


def kaldi_costs(uri: str) -> dict[str, float]:
    """`ac_cost` of a Kaldi n-best list by key (what a rescored `lm_cost` is computed against)."""
    text_file = posixpath.join(uri, "text") if _is_dir(uri) else uri
    return {k: v for k, (_, v) in _kaldi_table(posixpath.join(posixpath.dirname(text_file) or ".", "ac_cost"), _number)}


def _kaldi_text(uri: str) -> Iterator[tuple[str, str, str]]:
    """(where, key, text) of a Kaldi `key text` file; a key alone is an empty text."""
    for number, line in _lines(uri):
        if line.strip():
            key, _, text = line.strip().partition(" ")
            yield f"{uri} line {number}", key, text


def _kaldi_table(uri: str, parse: Callable[[str, str], float]) -> Iterator[tuple[str, tuple[str, float]]]:
    """key -> (where, value) of a Kaldi `key value` archive in text form."""
    for where, key, value in _kaldi_text(uri):
        yield key, (where, parse(value, where))


def _tensor_number(value: str, where: str) -> float:
    match = _TENSOR.match(value.strip())
    return _number(match.group(1) if match else value, where)


def _number(value: str, where: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise NBestError(f"{where}: the score {value.strip()[:40]!r} is not a number") from None
    if not math.isfinite(number):
        raise NBestError(f"{where}: the score is {number}, not a finite log-score")
    return number


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _lines(uri: str) -> Iterator[tuple[int, str]]:
    """(1-based number, line without its end) of a UTF-8 text file."""
    with open_file(uri, seekable=False) as stream:
        for number, raw in numbered_lines(stream, uri):
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise NBestError(f"{uri} line {number} is not UTF-8 text ({exc})") from exc


def _is_espnet1(document: Mapping) -> bool:
    utts = document.get("utts")
    return isinstance(utts, dict) and all(isinstance(e, dict) and "output" in e for e in utts.values())


def _is_dir(uri: str) -> bool:
    return scheme(uri) is None and Path(uri).is_dir()


def _has_costs(folder: str) -> bool:
    return scheme(folder) is None and all((Path(folder) / name).is_file() for name in ("lm_cost", "ac_cost"))


def _suffix(uri: str) -> str:
    suffixes = [s.lower() for s in Path(uri).suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


@dataclass(frozen=True)
class RescoredHypothesis:
    """A hypothesis's figures after rescoring: what is written back into its list."""

    total: float  # the rescored natural-log total (what ranks the hypotheses now)
    lm_score: float  # the LM score that total adds, lambda times it (the MLM's PLL with the masked LM alone)
    rank: int  # 1 = the rescored 1-best of its utterance


def rescored_files(
    uri: str,
    fmt: str,
    table: pa.Table,
    rescored: Mapping[tuple[str, int], RescoredHypothesis],
    stem: str,
    acwt: float = 1.0,
) -> dict[str, str | pa.Table]:
    """The list `uri` (read into `table` as `fmt`) written back in its own format with the rescoring:
    file name (`stem` + the format's ending) -> text, or a table for Parquet. Each toolkit's scripts read
    the result as they read the list: see docs/rescore.md, "RescoredHypothesis lists"."""
    rows = [{**row, "new": rescored[(row[UTT_ID], row[HYP_ID])]} for row in table.to_pylist()]
    by_utt: dict[str, list[dict]] = {}
    for row in rows:
        by_utt.setdefault(row[UTT_ID], []).append(row)
    ranked = [sorted(hyps, key=lambda r: r["new"].rank) for hyps in by_utt.values()]
    if fmt == "fairseq":
        return {f"{stem}.txt": _fairseq_rescored(uri, rescored)}
    if fmt in ("marian", "moses"):
        lines = [
            f"{r[UTT_ID]} ||| {r[TEXT]} ||| {r.get(FEATURES) or ''} MLM= {r['new'].lm_score} ||| {r['new'].total}"
            for hyps in ranked
            for r in hyps
        ]
        return {f"{stem}.nbest": _join(lines)}
    if fmt == "nemo":
        return {f"{stem}.tsv": _join(f"{r[TEXT]}\t{r['new'].total}" for hyps in ranked for r in hyps)}
    if fmt == "kaldi":
        return _kaldi_rescored(uri, rows, stem, acwt)
    if fmt == "espnet":
        return _espnet2_rescored(ranked, stem) if _is_dir(uri) else _espnet1_rescored(uri, rescored, stem)
    return _records_rescored(fmt, uri, ranked, stem)


def _fairseq_rescored(uri: str, rescored: Mapping[tuple[str, int], RescoredHypothesis]) -> str:
    """The generate output with each sample's hypotheses (their H-, D-, P-, A-, I-, E- lines) in rescored
    order at the place of the first, H- and D- scores the rescored total in base 2; other lines kept."""
    out: list[str | int] = []  # lines, and the sample ids whose hypotheses go there
    blocks: dict[int, list[list[str]]] = {}
    for _, line in _lines(uri):
        match = _FAIRSEQ_LINE.fullmatch(line)
        kind, sid = (match.group(1), int(match.group(2))) if match else ("", -1)
        if kind == "H":
            if sid not in blocks:
                blocks[sid] = []
                out.append(sid)
            blocks[sid].append([])
        if kind in ("H", "D", "P", "A", "I", "E") and blocks.get(sid):
            if kind in ("H", "D"):
                new = rescored[(str(sid), len(blocks[sid]))]
                line = f"{kind}-{sid}\t{new.total / LN2}\t{line.split(chr(9), 2)[2]}"
            blocks[sid][-1].append(line)
        else:
            out.append(line)
    lines: list[str] = []
    for item in out:
        if isinstance(item, str):
            lines.append(item)
            continue
        order = sorted(range(len(blocks[item])), key=lambda k: rescored[(str(item), k + 1)].rank)
        lines += [line for k in order for line in blocks[item][k]]
    return _join(lines)


def _kaldi_rescored(uri: str, rows: list[dict], stem: str, acwt: float) -> dict[str, str | pa.Table]:
    """Kaldi's three archives with the keys unchanged: the words, `ac_cost` as read and a new `lm_cost`
    such that acwt * ac_cost + lm_cost = -total (as rnnlmrescore.sh replaces the LM cost), so
    linear-to-nbest and the usual minimum-cost 1-best read the rescored list."""
    ac = kaldi_costs(uri)
    keys = [f"{r[UTT_ID]}-{r[HYP_ID]}" for r in rows]
    return {
        f"{stem}/text": _join(f"{k} {r[TEXT]}" for k, r in zip(keys, rows)),
        f"{stem}/ac_cost": _join(f"{k} {ac[k]}" for k in keys),
        f"{stem}/lm_cost": _join(f"{k} {-r['new'].total - acwt * ac[k]}" for k, r in zip(keys, rows)),
    }


def _espnet2_rescored(ranked: list[list[dict]], stem: str) -> dict[str, str | pa.Table]:
    """`{n}best_recog/text` and `score` by rescored rank (ESPnet's scoring reads `1best_recog/text`); the
    score is the rescored total as a plain number."""
    files: dict[str, list[str]] = {}
    for hyps in ranked:
        for rank, r in enumerate(hyps, start=1):
            files.setdefault(f"{stem}/{rank}best_recog/text", []).append(f"{r[UTT_ID]} {r[TEXT]}")
            files.setdefault(f"{stem}/{rank}best_recog/score", []).append(f"{r[UTT_ID]} {r['new'].total}")
    return {name: _join(lines) for name, lines in files.items()}


def _espnet1_rescored(
    uri: str, rescored: Mapping[tuple[str, int], RescoredHypothesis], stem: str
) -> dict[str, str | pa.Table]:
    """The recognition JSON with each `output` list in rescored order, `score` the rescored total and the
    sequence model's score kept as `seq_score`, the LM's as `mlm_score` (ESPnet1's json2trn.py takes output[0])."""
    document = load_json(uri, ESPNET1_JSON)
    for utt_id, entry in document["utts"].items():
        outputs = []
        for rank, out in enumerate(entry["output"], start=1):
            new = rescored[(utt_id, rank)]
            outputs.append(
                (new.rank, {**out, "score": new.total, "seq_score": out["score"], "mlm_score": new.lm_score})
            )
        entry["output"] = [out for _, out in sorted(outputs, key=lambda o: o[0])]
    return {f"{stem}.json": json.dumps(document, indent=4, ensure_ascii=False, sort_keys=True) + "\n"}


def _records_rescored(fmt: str, uri: str, ranked: list[list[dict]], stem: str) -> dict[str, str | pa.Table]:
    """JSONL, Parquet and mlm-scoring's JSON have no rescored form of their own: the records as read, in
    rescored order, with `mlm_score`, `total` and `rescored_rank` added and the sequence `score` kept."""
    records = [
        {
            **{k: v for k, v in r.items() if k != "new" and v is not None},
            "mlm_score": r["new"].lm_score,
            "total": r["new"].total,
            "rescored_rank": r["new"].rank,
        }
        for hyps in ranked
        for r in hyps
    ]
    if fmt == "parquet":
        return {f"{stem}.parquet": pa.Table.from_pylist(records)}
    if fmt == "jsonl":
        return {f"{stem}.jsonl": _join(json.dumps(r, ensure_ascii=False) for r in records)}
    document: dict[str, dict] = {}
    for r in records:
        entry = document.setdefault(r[UTT_ID], {REF: r[REF]} if REF in r else {})
        entry[f"hyp_{r[HYP_ID]}"] = {k: r[k] for k in (SCORE, TEXT, "mlm_score", "total", "rescored_rank")}
    return {f"{stem}.json": json.dumps(document, indent=2, ensure_ascii=False) + "\n"}


def _join(lines: Iterable[str]) -> str:
    return "".join(f"{line}\n" for line in lines)
