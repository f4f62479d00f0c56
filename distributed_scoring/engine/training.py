"""Training an encoder: the loop, its resumable state, and the objectives (u-PMLM; the maskless students:
sentence regression, per-token regression, per-position distillation).

The loop is data-parallel but knows nothing of Ray: the caller passes its rank and world size, a `wrap`
for the model (DistributedDataParallel under Ray Train) and an `on_step` callback that reports metrics and
writes checkpoints. Every step takes the same global batch of `batch_size` examples whatever the number
of workers (worker r takes rows r, r + W, ... of it), drawn from a permutation of the examples seeded by
(seed, epoch) (the examples left over after the last whole batch of an epoch sit that epoch out), and
every random draw of a step (its masks, and dropout, which draws from torch's global generator) is
seeded by (seed, step, rank): a run resumed from a checkpoint at step s goes on exactly as the run that
wrote it would have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .masked_lm import MaskedLM, to_device
from .maskless import SentenceRegressor, padded

STATE_FILE = "training_state.pt"
WARMUP = 0.1  # share of the steps over which the learning rate rises linearly from 0; it then falls to 0
MAX_GRAD_NORM = 1.0
WEIGHT_DECAY = 0.01
HEAD_LR_SCALE = 20.0  # a freshly initialised head learns at this multiple of the encoder's rate


@dataclass(frozen=True)
class Example:
    """One training sequence: token ids with special tokens, the positions of its scorable (non-special)
    tokens, and what a maskless student is fitted to (unused by u-PMLM): the teacher's PLL, its per-token
    terms, and the top of its conditional at each scored position (`engine.pll.Conditionals`)."""

    input_ids: np.ndarray  # (L,) int64
    positions: np.ndarray  # (n,) int64
    target: float = 0.0
    token_targets: np.ndarray | None = None  # (n,) float64 log p(w_t | W without w_t)
    cond_ids: np.ndarray | None = None  # (n, k) int64 the teacher's k most probable tokens at t
    cond_logprobs: np.ndarray | None = None  # (n, k) their log-probabilities
    cond_rest: np.ndarray | None = None  # (n,) log of the mass of every other token (-inf when k = V)


@dataclass(frozen=True)
class Schedule:
    """How long and how fast: `steps` optimiser steps of `batch_size` examples each (over all workers),
    AdamW at peak `lr` with linear warm-up and decay, a checkpoint every `checkpoint_every` steps and at
    the last one."""

    steps: int
    batch_size: int
    lr: float
    seed: int
    checkpoint_every: int


def steps_for(epochs: int, examples: int, batch_size: int) -> int:
    """Optimiser steps of `epochs` passes over `examples` in whole batches of `batch_size`."""
    return epochs * (examples // batch_size)


def batch_rows(step: int, examples: int, schedule: Schedule, rank: int, world: int) -> np.ndarray:
    """Indices of this worker's share of the global batch of `step`: whole batches through a permutation
    of the examples seeded by (seed, epoch)."""
    per_epoch = examples // schedule.batch_size
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([schedule.seed, epoch]).permutation(examples)
    batch = order[index * schedule.batch_size : (index + 1) * schedule.batch_size]
    return batch[rank::world]


class Objective(Protocol):
    """What a run trains: `module` holds every trained parameter (it is what `wrap` wraps), `groups` are
    the optimiser's parameter groups at peak rate `lr`, `loss` is the mean loss of a batch given the
    (possibly wrapped) module."""

    module: nn.Module

    def groups(self, lr: float) -> list[dict]: ...

    def loss(self, module: nn.Module, examples: Sequence[Example], generator: torch.Generator) -> torch.Tensor: ...


class SentenceObjective:
    """Regression of the teacher's PLL from the first token (Salazar et al., 2020, sec. 2.2): the squared
    error of the predicted PLL divided by the teacher's std (see `engine.maskless.SentenceRegressor`)."""

    def __init__(self, regressor: SentenceRegressor, mlm: MaskedLM) -> None:
        self.module = regressor
        self.mlm = mlm

    def groups(self, lr: float) -> list[dict]:
        """The encoder at `lr`; the head, which starts from nothing, faster (Adam moves a weight by about the
        rate per step: at an encoder's 1e-4 a head of unit-scale features would take thousands of steps)."""
        return [
            {"params": trainable(self.module.encoder), "lr": lr},
            {"params": trainable(self.module.head), "lr": lr * HEAD_LR_SCALE},
        ]

    def loss(self, module: nn.Module, examples: Sequence[Example], generator: torch.Generator) -> torch.Tensor:
        ids, mask = padded([e.input_ids for e in examples], self.mlm.pad_token_id)
        targets = torch.tensor([e.target for e in examples], dtype=torch.float64, device=self.mlm.device)  # (B,)
        with self.mlm.autocast():
            predicted = module(to_device(ids, self.mlm.device), to_device(mask, self.mlm.device))  # (B,) float64
        return (((predicted - targets) / self.module.std) ** 2).mean().float()


class TokenObjective:
    """The masked LM on the unmasked sentence, fitted position by position to the teacher (the `token` and
    `distribution` students): `token_weight` times the squared error of log q_t(w_t) against the teacher's
    log p(w_t | W without w_t), plus `kl_weight` times KL(p_t || q_t), the teacher's conditional at t against
    the student's distribution there (word-level knowledge distillation, Kim and Rush, 2016), over the
    teacher's top k and the mass of the rest; both averaged over the scored tokens of the batch."""

    def __init__(self, mlm: MaskedLM, token_weight: float, kl_weight: float) -> None:
        self.module = MaskedPositionsLM(mlm)
        self.mlm = mlm
        self.token_weight = token_weight
        self.kl_weight = kl_weight

    def groups(self, lr: float) -> list[dict]:
        return [{"params": trainable(self.module), "lr": lr}]

    def loss(self, module: nn.Module, examples: Sequence[Example], generator: torch.Generator) -> torch.Tensor:
        device = self.mlm.device
        ids, mask = padded([e.input_ids for e in examples], self.mlm.pad_token_id)
        rows = np.concatenate([np.full(len(e.positions), b, dtype=np.int64) for b, e in enumerate(examples)])  # (Q,)
        positions = np.concatenate([e.positions for e in examples]).astype(np.int64)  # (Q,)
        with self.mlm.autocast():
            logits = module(
                to_device(ids, device), to_device(mask, device), to_device(rows, device), to_device(positions, device)
            )  # (Q, V)
        logq = F.log_softmax(logits.float(), dim=-1)  # (Q, V)
        loss = torch.zeros((), device=device)
        if self.token_weight:
            predicted = logq.gather(1, to_device(ids[rows, positions], device)[:, None]).squeeze(1)  # (Q,)
            targets = torch.tensor(
                np.concatenate([e.token_targets for e in examples]), dtype=torch.float32, device=device
            )  # (Q,)
            loss = loss + self.token_weight * F.mse_loss(predicted, targets)
        if self.kl_weight:
            loss = loss + self.kl_weight * top_k_kl(
                logq,
                *(
                    torch.tensor(np.concatenate([getattr(e, name) for e in examples]), device=device)
                    for name in ("cond_ids", "cond_logprobs", "cond_rest")
                ),
            )
        return loss


def top_k_kl(logq: torch.Tensor, ids: torch.Tensor, logp: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(p || q), p known by its top k (`ids`, `logp`, (Q, k)) and the log of the
    mass of the rest (`rest`, (Q,), -inf when k = V), q a full log-distribution (`logq`, (Q, V)): the KL
    between the two distributions over the k tokens and one bucket for all others."""
    logp = logp.to(logq.dtype)
    rest = rest.to(logq.dtype)
    top = (logp.exp() * (logp - logq.gather(1, ids))).sum(1)  # (Q,)
    left = torch.isfinite(rest)  # rows whose teacher kept mass outside its top k (none when k = V)
    if not left.any():
        return top.mean()
    others = logq[left].scatter(1, ids[left], float("-inf")).logsumexp(1)  # (R,) log q of the bucket
    bucket = torch.zeros_like(top)  # (Q,)
    bucket[left] = rest[left].exp() * (rest[left] - others)
    return (top + bucket).mean()


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of `module` that are trained (not frozen by `freeze_lower`)."""
    return [p for p in module.parameters() if p.requires_grad]


def freeze_lower(model: nn.Module, layers: int) -> None:
    """Keep the embeddings and the lowest `layers` transformer layers of a masked LM as they are: a student
    on a small corpus fine-tunes what sits above them, at a fraction of the backward pass's cost. (With tied
    input and output embeddings, as most MLMs have, the LM head's decoder matrix stays too.)"""
    if layers <= 0:
        return
    stack = next(
        (
            m
            for m in model.base_model.modules()
            if isinstance(m, nn.ModuleList) and len(m) == model.config.num_hidden_layers
        ),
        None,
    )
    if stack is None or layers > len(stack):
        raise ValueError(
            f"cannot freeze {layers} layers: the model has {len(stack) if stack else 'no'} "
            "recognisable transformer layers"
        )
    embeddings = getattr(model.base_model, "embeddings", None) or model.get_input_embeddings()
    for module in (embeddings, *stack[:layers]):
        for parameter in module.parameters():
            parameter.requires_grad_(False)


class MaskedPositionsLM(nn.Module):
    """A masked LM whose forward returns vocabulary logits only at the given (row, position) pairs:
    the encoder runs over the batch, the LM head over the gathered rows (full logits for architectures
    outside the head table). One module, so that data parallelism sees every parameter used."""

    def __init__(self, mlm: MaskedLM) -> None:
        super().__init__()
        self.model = mlm.model
        self.head = mlm.head

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        if self.head is None:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits[rows, positions]  # (Q, V)
        hidden = self.model.base_model(input_ids=input_ids, attention_mask=attention_mask)[0]  # (B, T, H)
        return self.head(hidden[rows, positions])  # (Q, V)


class PMLMObjective:
    """u-PMLM (Liao et al., 2020, sec. 3.2): per sequence a masking ratio r ~ U(0, 1], the ceil(r * n) of
    its n scorable tokens at random positions replaced by the mask token (so the number masked is uniform
    on 1..n), cross-entropy on the masked tokens, averaged per sequence (the 1/K of their Eq. 6), then
    over the batch."""

    def __init__(self, mlm: MaskedLM) -> None:
        self.module = MaskedPositionsLM(mlm)
        self.mlm = mlm

    def groups(self, lr: float) -> list[dict]:
        return [{"params": trainable(self.module), "lr": lr}]

    def loss(self, module: nn.Module, examples: Sequence[Example], generator: torch.Generator) -> torch.Tensor:
        ids, mask = padded([e.input_ids for e in examples], self.mlm.pad_token_id)
        rows, positions = upmlm_positions([e.positions for e in examples], generator)
        labels = ids[rows, positions]  # (Q,)
        ids[rows, positions] = self.mlm.mask_token_id
        device = self.mlm.device
        with self.mlm.autocast():
            logits = module(
                to_device(ids, device), to_device(mask, device), to_device(rows, device), to_device(positions, device)
            )  # (Q, V)
        per_token = F.cross_entropy(logits.float(), to_device(labels, device), reduction="none")  # (Q,)
        rows_t = to_device(rows, device)
        sums = torch.zeros(len(examples), device=device).index_add_(0, rows_t, per_token)  # (B,)
        counts = torch.bincount(rows_t, minlength=len(examples)).clamp(min=1)  # (B,)
        return (sums / counts).mean()


def upmlm_positions(scorable: Sequence[np.ndarray], generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(rows, positions) to mask, int64: for sequence b, ceil(r_b * n_b) of its scorable positions chosen
    uniformly without replacement, r_b ~ U(0, 1]."""
    rows, positions = [], []
    for b, candidates in enumerate(scorable):
        n = len(candidates)
        r = 1.0 - torch.rand((), generator=generator).item()  # U(0, 1]
        k = max(1, math.ceil(r * n))
        chosen = torch.randperm(n, generator=generator)[:k].numpy()
        rows.append(np.full(k, b, dtype=np.int64))
        positions.append(np.sort(candidates[chosen]).astype(np.int64))
    return np.concatenate(rows), np.concatenate(positions)


@dataclass
class TrainState:
    """What a checkpoint holds: the trained module's weights (unwrapped), the optimiser and schedule, the
    number of steps done."""

    step: int
    module: dict
    optimizer: dict
    scheduler: dict

    def save(self, folder: str | Path) -> None:
        torch.save(
            {"step": self.step, "module": self.module, "optimizer": self.optimizer, "scheduler": self.scheduler},
            Path(folder) / STATE_FILE,
        )

    @classmethod
    def load(cls, folder: str | Path) -> "TrainState":
        data = torch.load(Path(folder) / STATE_FILE, map_location="cpu", weights_only=True)
        return cls(data["step"], data["module"], data["optimizer"], data["scheduler"])


# on_step(step, metrics, save): called after every step on every worker; `save` writes the state into a
# folder and is given at checkpoint steps only (every worker gets it: the caller decides who writes).
OnStep = Callable[[int, dict, "Callable[[str], None] | None"], None]


def fit(
    objective: Objective,
    examples: Sequence[Example],
    schedule: Schedule,
    on_step: OnStep,
    resume: str | None = None,
    wrap: Callable[[nn.Module], nn.Module] = lambda m: m,
    rank: int = 0,
    world: int = 1,
) -> int:
    """Train `objective.module` for the schedule's steps, from the state saved in `resume` when given;
    returns the step reached. Metrics per step: step, epoch, loss (of the whole batch), lr (the encoder's),
    examples (in the batch)."""
    module = objective.module
    optimizer, scheduler, start = _optimizer(objective, schedule, resume)
    if len(examples) < schedule.batch_size or schedule.batch_size < world:
        raise ValueError(
            f"{len(examples)} examples, batches of {schedule.batch_size}, {world} workers: a batch "
            "must fit in the examples and give every worker a row"
        )
    trained = wrap(module)
    trained.train()
    per_epoch = len(examples) // schedule.batch_size
    for step in range(start, schedule.steps):
        rows = batch_rows(step, len(examples), schedule, rank, world)
        seed = hash_seed(schedule.seed, step, rank)
        torch.manual_seed(seed)  # dropout
        generator = torch.Generator().manual_seed(seed)
        lr = scheduler.get_last_lr()[0]  # the encoder's
        loss = objective.loss(trained, [examples[i] for i in rows], generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable(module), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        done = step + 1
        metrics = {
            "step": done,
            "epoch": step // per_epoch,
            "loss": _mean_over_workers(loss.detach(), world),
            "lr": lr,
            "examples": schedule.batch_size,
        }
        checkpoint = done % schedule.checkpoint_every == 0 or done == schedule.steps
        on_step(done, metrics, _saver(done, module, optimizer, scheduler) if checkpoint else None)
    module.eval()
    return schedule.steps


def _optimizer(
    objective: Objective, schedule: Schedule, resume: str | None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR, int]:
    """(AdamW over the objective's parameter groups, its learning rate warmed up over the first WARMUP share
    of the steps and then decayed linearly to 0, the step to start from): fresh, or the module, optimiser
    and schedule restored from the state saved in `resume`."""
    optimizer = torch.optim.AdamW(objective.groups(schedule.lr), weight_decay=WEIGHT_DECAY)
    warmup = max(1, int(WARMUP * schedule.steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (schedule.steps - s) / max(1, schedule.steps - warmup)))
    )
    if resume is None:
        return optimizer, scheduler, 0
    state = TrainState.load(resume)
    objective.module.load_state_dict(state.module)
    optimizer.load_state_dict(state.optimizer)
    scheduler.load_state_dict(state.scheduler)
    return optimizer, scheduler, state.step


def _mean_over_workers(loss: torch.Tensor, world: int) -> float:
    """The batch's loss: the mean of the workers' (each over its share of the batch)."""
    if world > 1:
        loss = loss.clone()
        torch.distributed.all_reduce(loss)
        loss /= world
    return float(loss)


def _saver(step: int, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> Callable[[str], None]:
    """Writes the state after `step` into a folder (called on the worker that writes checkpoints)."""
    return lambda folder: TrainState(step, module.state_dict(), optimizer.state_dict(), scheduler.state_dict()).save(
        folder
    )


def hash_seed(*parts: int) -> int:
    """A 63-bit seed from several integers (numpy's seed sequence: no collisions from simple sums)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(2, np.uint64)[0] >> np.uint64(1))
