"""Column names and pyarrow schemas of every table the package passes between stages or writes.

Data flows read -> prepare -> score -> write; each stage adds columns to the table it received, so the
names are defined once here and every module imports them.
"""

from __future__ import annotations

import pyarrow as pa

# Read stage: one row per input line / record.
ID = "id"
TEXT = "text"
STATUS = "status"
ERROR = "error"
PARTITION = "partition"  # optional: a column's value or the input file's name, carried to the output
LINE = "line"  # with --allow-duplicate-ids: where the row was read, `<file>:<record>`; the key is (id, line)

STATUS_OK = "ok"
STATUS_ERROR = "error"

# Prepare stage: tokenisation (ragged lists, one entry per model token of the sentence).
INPUT_IDS = "input_ids"
TARGETS = "targets"  # positions (into input_ids) that are masked and scored, in order
PIECE_WORDS = "piece_words"  # tokenizer word id per token, -1 for special tokens (word_l2r masking)
TARGET_WORDS = "target_words"  # whitespace-word index of each target (word-level scores)
N_WORDS = "n_words"
N_UNKNOWN = "n_unknown"  # scored tokens that are the tokenizer's unknown token
WINDOWED = "windowed"  # the text was longer than the model's window and was scored in windows (`engine.windows`)

# Score stage: the published output columns.
MODEL = "model"
VARIANT = "variant"
PLL = "pll"
N_TOKENS = "n_tokens"
PPPL_TOKEN = "pppl_token"
PPPL_WORD = "pppl_word"
TOKENS = "tokens"
TOKEN_LOGPROBS = "token_logprobs"
WORD_SCORES = "word_scores"
OUT_OF_RANGE = "out_of_range"  # maskless student rows: the prediction lies outside its training rows' span
# With --conditionals K, per scored token (aligned with `tokens`): the teacher's conditional p(. | W without w_t).
COND_IDS = "cond_ids"  # the K most probable token ids, most probable first
COND_LOGPROBS = "cond_logprobs"  # their natural-log probabilities
COND_REST = "cond_rest"  # log of the probability of every other token (-inf when K covers the vocabulary)
LOGP = "logp"  # causal LM: log P(W) including the end term (N_TOKENS = |W|)

READ_FIELDS = [
    pa.field(ID, pa.string(), nullable=False),
    pa.field(TEXT, pa.string()),
    pa.field(STATUS, pa.string(), nullable=False),
    pa.field(ERROR, pa.string()),
]
PARTITION_FIELD = pa.field(PARTITION, pa.string())
LINE_FIELD = pa.field(LINE, pa.string(), nullable=False)

PREPARED_FIELDS = [
    pa.field(INPUT_IDS, pa.list_(pa.int32())),
    pa.field(TARGETS, pa.list_(pa.int32())),
    pa.field(PIECE_WORDS, pa.list_(pa.int32())),
    pa.field(TARGET_WORDS, pa.list_(pa.int32())),
    pa.field(N_WORDS, pa.int32()),
    pa.field(N_UNKNOWN, pa.int32()),
]


def _with_partition(fields: list[pa.Field], partition: bool) -> pa.Schema:
    return pa.schema(fields + [PARTITION_FIELD] if partition else fields)


def read_schema(partition: bool = False, extra: tuple[str, ...] = (), line: bool = False) -> pa.Schema:
    """Read rows: id, text, status, error, the `extra` columns asked for (strings), then `partition`, then
    `line` (with --allow-duplicate-ids; every stage carries it to its output, see `pipeline.stage`)."""
    schema = _with_partition(READ_FIELDS + [pa.field(name, pa.string()) for name in extra], partition)
    return schema.append(LINE_FIELD) if line else schema


def key(row: dict) -> dict:
    """A row's key columns, for a stage that builds its output rows afresh: `id`, and `line` when the rows
    carry one (ids may then repeat)."""
    return {ID: row[ID], LINE: row[LINE]} if LINE in row else {ID: row[ID]}


def prepared_schema(partition: bool = False) -> pa.Schema:
    return _with_partition(READ_FIELDS + PREPARED_FIELDS, partition)


def output_schema(
    per_token: bool = False,
    word_scores: bool = False,
    partition: bool = False,
    conditionals: bool = False,
    out_of_range: bool = False,
    windowed: bool = False,
) -> pa.Schema:
    """The schema of the scored Parquet rows.

    `pll` and the PPPLs are null on error rows; `n_tokens` is the number of scored tokens and
    `n_words` the number of whitespace-separated words (both 0 on error rows). `n_unknown` counts the
    scored tokens that are the tokenizer's unknown token (`[UNK]`): text the model cannot read (a protein
    written without spaces for a per-residue model, English under an antibody model) still scores as
    `ok`, so this column is how such rows are found. `model` and `variant`
    say which scorer produced the row, so outputs of several runs can be concatenated safely.
    `out_of_range` (a maskless student's rows) is true where the predicted PLL per token lies outside the
    range the student's training rows spanned, null on error rows. `conditionals` (with `per_token`)
    adds the top of each scored token's conditional, in float32: a distillation target, not a published
    score. `windowed` (`--long-texts window`) is true for a text longer than the model's window, each of
    whose tokens was scored in a window of the model's width (`engine.windows`); false on error rows.
    `partition` is last, when the run was asked to partition its rows.
    """
    fields = [
        pa.field(ID, pa.string(), nullable=False),
        pa.field(TEXT, pa.string()),
        pa.field(PLL, pa.float64()),
        pa.field(N_TOKENS, pa.int32(), nullable=False),
        pa.field(N_WORDS, pa.int32(), nullable=False),
        pa.field(N_UNKNOWN, pa.int32(), nullable=False),
        pa.field(PPPL_TOKEN, pa.float64()),
        pa.field(PPPL_WORD, pa.float64()),
        pa.field(STATUS, pa.string(), nullable=False),
        pa.field(ERROR, pa.string()),
        pa.field(MODEL, pa.string(), nullable=False),
        pa.field(VARIANT, pa.string(), nullable=False),
    ]
    if windowed:
        fields.append(pa.field(WINDOWED, pa.bool_(), nullable=False))
    if out_of_range:
        fields.append(pa.field(OUT_OF_RANGE, pa.bool_()))
    if per_token:
        fields += [
            pa.field(TOKENS, pa.list_(pa.string())),
            pa.field(TOKEN_LOGPROBS, pa.list_(pa.float64())),
        ]
    if word_scores:
        fields.append(pa.field(WORD_SCORES, pa.list_(pa.float64())))
    if conditionals:
        fields += [
            pa.field(COND_IDS, pa.list_(pa.list_(pa.int32()))),
            pa.field(COND_LOGPROBS, pa.list_(pa.list_(pa.float32()))),
            pa.field(COND_REST, pa.list_(pa.float32())),
        ]
    return _with_partition(fields, partition)
