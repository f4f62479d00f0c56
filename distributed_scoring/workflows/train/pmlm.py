"""`dscore train pmlm`: continue training a masked LM with the u-PMLM objective (Liao et al., 2020), and
report its random-order perplexity on held-out rows before and after.

The corpus is read with the scoring inputs' readers (any file, folder or glob `dscore score` takes), split
by a seeded hash of the row id and tokenised on the driver; the objective (`engine.training.PMLMObjective`)
masks a share r ~ U(0, 1] of each sequence's tokens. The report's perplexities are `dscore score --method
chain`'s: exp(-sum log p(x) / sum tokens) over the held-out rows, in left-to-right order and in `orders`
random orders per row (the same orders before and after, averaged per row in probability space), Liao
et al.'s "sequential" and "random" PPL (Tables 2 and 3). For a u-PMLM the chain is its
likelihood; for the MLM it started from, only an approximation, which is what training should improve.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...config import InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from ...errors import UserError
from ...io import schema as S
from ...io.claim import Claim, claim_training
from ...io.ids import check_unique_ids
from ...io.output import REPORT_JSON
from ...io.sources import plan_shards, read_unit, read_units
from ...io.storage import join
from ...options import check_bounds
from ...workloads.prepare import PLLPreparer
from .run import (
    DATA_HELDOUT,
    DATA_TRAIN,
    TRAINING_OUTPUTS,
    TrainOptions,
    TrainResources,
    fit_on_ray,
    heldout_rows,
    on_ray,
    read_examples,
    start_worker,
    train,
    training_figures,
    training_fingerprint,
)

logger = logging.getLogger(__name__)

LR = 5e-5  # default peak learning rate: continued pre-training of every weight
EVALUATION_DIR = "evaluation"  # DIR/evaluation/<before|after>-<order>: the chain-scoring runs of the held-out rows


@dataclass(frozen=True)
class Corpus:
    """The training texts: where they come from and their readable rows (id, text)."""

    paths: tuple[str, ...]
    text_column: str
    id_column: str | None
    split_chars: bool
    rows: pa.Table

    @property
    def digest(self) -> str:
        return hashlib.sha256(
            "\n".join(f"{i}\t{t}" for i, t in zip(self.rows[S.ID].to_pylist(), self.rows[S.TEXT].to_pylist())).encode()
        ).hexdigest()


def read_corpus(
    paths: tuple[str, ...],
    text_column: str = "text",
    id_column: str | None = None,
    split_chars: bool = False,
    allow_duplicate_ids: bool = False,
) -> Corpus:
    """The readable rows of the inputs (as `dscore score` reads them; ids default to file:line, and the
    held-out split hashes them: repeated ids are refused unless `allow_duplicate_ids`, and then go to one
    split together); none readable is an error."""
    spec = InputSpec(paths, text_column, id_column, allow_duplicate_ids=allow_duplicate_ids)
    plan = plan_shards(spec)
    check_unique_ids(plan, spec)
    tables = [rows for unit in read_units(plan) for _, rows in read_unit(unit, spec)]
    table = pa.concat_tables(tables) if tables else pa.table({S.ID: [], S.TEXT: [], S.STATUS: []})
    ok = table.filter(pc.equal(table[S.STATUS], S.STATUS_OK)).select([S.ID, S.TEXT])
    if ok.num_rows == 0:
        raise UserError(f"--data {' '.join(paths)} holds no readable rows ({table.num_rows} rows read)")
    return Corpus(paths, text_column, id_column, split_chars, ok)


@dataclass(frozen=True)
class PMLMJob:
    """What the training workers and the evaluation tasks need (torch-free, pickled to them)."""

    model: ModelSpec
    location: str
    options: TrainOptions
    steps: int
    checkpoint_every: int
    orders: int
    batch_tokens: int | None


def train_pmlm(
    corpus: Corpus,
    model: ModelSpec,
    output: str,
    options: TrainOptions = TrainOptions(lr=LR),
    resources: TrainResources = TrainResources(),
    overwrite: bool = False,
    batch_tokens: int | None = None,
    orders: int = 1,
) -> dict:
    """Continue training `model` with u-PMLM on the corpus into `output` (a model folder `dscore score
    --model` loads); returns the report (also DIR/report.json) with held-out perplexities before and after."""
    check_bounds("--orders", orders, 1)
    check_bounds("--batch-tokens", batch_tokens, 1)
    train_table, heldout_table, left_out = _checked_split(corpus, model, options, resources)
    run = _fingerprint(corpus, model, options)
    with claim_training(output, run, overwrite, corpus.paths, [model.name], TRAINING_OUTPUTS) as folder:
        out = folder.out
        out.write_table(DATA_TRAIN, train_table)
        heldout_path = out.write_table(DATA_HELDOUT, heldout_table)
        steps = options.total_steps(train_table.num_rows)
        job = PMLMJob(model, out.location, options, steps, resources.checkpoint_every, orders, batch_tokens)
        before, after = _train_and_evaluate(folder, job, heldout_path, corpus.split_chars, resources)
        report = {
            "command": "train pmlm",
            "data": list(corpus.paths),
            "model": model.name,
            "output": output,
            "rows": {
                "usable": corpus.rows.num_rows,
                "train": train_table.num_rows,
                "heldout": heldout_table.num_rows,
                "left_out_over_max_length": left_out,
            },
            "training": training_figures(
                out, steps, options, "u-PMLM cross-entropy of the masked tokens, per sequence, then per batch"
            ),
            "heldout": {
                "before": before,
                "after": after,
                "orders": orders,
                "seed": options.seed,
                "runs": f"{EVALUATION_DIR}/(before|after)-(l2r|random)",
            },
        }
        out.write_json(REPORT_JSON, report)
    return report


def _fingerprint(corpus: Corpus, model: ModelSpec, options: TrainOptions) -> dict:
    """What the training folder's run depends on: beside the model and the schedule, the corpus (its
    paths, how they are read, its rows)."""
    return training_fingerprint(
        "pmlm",
        model,
        options,
        {
            "data": list(corpus.paths),
            "text_column": corpus.text_column,
            "id_column": corpus.id_column,
            "split_chars": corpus.split_chars,
            "data_rows": corpus.digest,
        },
    )


def _checked_split(
    corpus: Corpus, model: ModelSpec, options: TrainOptions, resources: TrainResources
) -> tuple[pa.Table, pa.Table, int]:
    """`_split` of the corpus by the model's tokenizer, refused when a split is too small to train or
    report on: checked before the folder is touched."""
    from ...engine.model_files import load_tokenizer

    tokenizer, model_max = load_tokenizer(model)
    preparer = PLLPreparer(tokenizer, model_max, corpus.split_chars)
    train_table, heldout_table, left_out = _split(corpus, preparer, options)
    if heldout_table.num_rows == 0:
        raise UserError(f"the held-out split of {corpus.rows.num_rows} rows is empty: raise --heldout or add rows")
    if train_table.num_rows < max(options.batch_size, resources.num_workers):
        raise UserError(
            f"{train_table.num_rows} training rows ({left_out} over --max-length {options.max_length} left "
            f"out) do not fill one batch of --batch-size {options.batch_size} over {resources.num_workers} "
            "workers: lower --batch-size, raise --max-length or add rows"
        )
    return train_table, heldout_table, left_out


def _train_and_evaluate(
    folder: Claim, job: PMLMJob, heldout_path: str, split_chars: bool, resources: TrainResources
) -> tuple[dict, dict]:
    """(perplexities before, after): the held-out rows scored by the starting model, the model trained
    on Ray Train into the held folder, then the held-out rows scored by the trained one."""
    with on_ray(resources):
        before = perplexities(folder, "before", job.model, heldout_path, job, split_chars, resources)
        fit_on_ray(pmlm_worker, job, resources, folder.out)
        folder.record_new()  # the model and tokenizer files worker 0 saved
        trained = replace(job.model, name=folder.out.location, revision=None)
        after = perplexities(folder, "after", trained, heldout_path, job, split_chars, resources)
    return before, after


def _split(corpus: Corpus, preparer: PLLPreparer, options: TrainOptions) -> tuple[pa.Table, pa.Table, int]:
    """(training table, held-out table, training rows left out as longer than --max-length), tokenised;
    held-out rows are kept up to the model's maximum."""
    prepared = preparer.prepare_texts(corpus.rows[S.TEXT].to_pylist())
    held = heldout_rows(corpus.rows[S.ID].to_pylist(), options.seed, options.heldout)
    fits = np.array([p.error is None for p in prepared])
    short = np.array([p.error is None and len(p.input_ids) <= options.max_length for p in prepared])
    table = corpus.rows.append_column(S.INPUT_IDS, pa.array([p.input_ids for p in prepared], pa.list_(pa.int32())))
    table = table.append_column(S.TARGETS, pa.array([p.targets for p in prepared], pa.list_(pa.int32())))
    train = table.filter(pa.array(~held & short)).select([S.ID, S.INPUT_IDS, S.TARGETS])
    return train, table.filter(pa.array(held & fits)), int((~held & fits & ~short).sum())


def pmlm_worker(config: dict) -> None:
    """One Ray Train worker: u-PMLM on the training split; worker 0 saves the model and tokenizer into DIR."""
    from ...engine.masked_lm import load_masked_lm
    from ...engine.training import PMLMObjective

    job: PMLMJob = config["job"]
    worker = start_worker(config)
    mlm = load_masked_lm(replace(job.model, device=worker.device))
    train(PMLMObjective(mlm), read_examples(join(job.location, DATA_TRAIN)), job, worker, "pmlm")
    if worker.rank == 0:
        mlm.model.save_pretrained(job.location)
        mlm.tokenizer.save_pretrained(job.location)


def perplexities(
    folder: Claim,
    name: str,
    model: ModelSpec,
    heldout_path: str,
    job: PMLMJob,
    split_chars: bool,
    resources: TrainResources,
) -> dict:
    """Chain-rule perplexities of `model` on the held-out rows, left to right and in `job.orders` seeded
    random orders: `dscore score --method chain` runs into DIR/evaluation/<name>-<order> (resumable),
    their scoring actors as many and as large as the training workers."""
    from ..chain import ChainOptions, score_chain

    ray = RayOptions(resources.address, resources.num_workers, resources.cpus_per_worker)
    figures = {}
    for order, k in (("l2r", 1), ("random", job.orders)):
        config = RunConfig(
            InputSpec((heldout_path,), id_column=S.ID),
            model,
            ScoringOptions(batch_tokens=job.batch_tokens),
            folder.subfolder(f"{EVALUATION_DIR}/{name}-{order}"),
        )
        figures[order] = score_chain(config, ChainOptions(order, k, job.options.seed, split_chars), ray)
    random = figures["random"]
    return {
        "sentences": random["ok"],
        "tokens": random["n_tokens"],
        "ppl_l2r": figures["l2r"]["ppl_token"],
        "ppl_random": random["ppl_token"],
        "ppl_random_each_order": random["by_order"]["ppl_token"],
    }
