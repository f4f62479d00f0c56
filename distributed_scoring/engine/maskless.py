"""Maskless scoring (Salazar et al., 2020, sec. 2.2, 3.6 and Table 6): a sentence's PLL in one forward pass.

A PLL costs one masked copy per token; these scorers read the sentence once, unmasked:

- `unmasked` (`dscore score --method unmasked`, the paper's "no masking" row): the masked LM itself on the
  unmasked sentence, sum over the scored tokens of log p(w_t | W). No training; the floor a student must beat.
- `token` and `distribution` students (`dscore train maskless --target token|distribution`): the same
  computation with a fine-tuned masked LM. At initialisation they ARE `unmasked`; training moves each
  position's distribution q_t towards the teacher's conditional p(. | W without w_t) (word-level knowledge
  distillation, Kim and Rush, 2016), or its log q_t(w_t) towards the teacher's per-token term. Every
  per-token prediction is a log-probability from a softmax, so no prediction can be above 0.
- `sentence` student (the paper's method): the encoder and a linear head over the first token ([CLS], <s>)
  regress the PLL itself. Its output is PLL = -softplus(a), never above 0, with a = offset - scale * head(h)
  chosen so that a fresh head (near 0) predicts the teacher's mean with slope `std`: near the start the model
  is the paper's standardised regression (PLL = mean + std * head(h)), so the loss |(PLL - q) / std|^2 has the
  paper's minimiser.

A student folder is an ordinary masked-LM folder (the fine-tuned encoder with the MLM's head, and the
tokenizer: `load_masked_lm` reads it) plus `maskless.json` (format, target, teacher, held-out figures, the
range of the training rows, the calibration) and, for `sentence`, the head's weights. A student's
predictions pass through its calibration (`model_files.Calibration`, an affine map per token fitted on its
held-out rows) before anyone sees them; the training's own evaluation loads it uncalibrated to fit that map.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ..config import ModelSpec
from .masked_lm import CUDA_OUT_OF_MEMORY, MaskedLM, OnDevice, load_masked_lm, to_device
from .masking import Sentence
from .model_files import (
    STUDENT_FILE,
    STUDENT_FORMAT,
    STUDENT_HEAD_FILE,
    TARGET_SENTENCE,
    UNCALIBRATED,
    Calibration,
    check_student_tokenizer,
    read_student_info,
    student_calibration,
    tokenizer_digest,
)
from .packing import ONE_PASS_PADDING, TokenBudget, Work, pack, run_fitting


def softplus_inverse(y: float) -> float:
    """x with softplus(x) = y > 0, without overflow for large y (y + log(1 - e^-y))."""
    return y + math.log(-math.expm1(-y))


class SentenceRegressor(nn.Module):
    """Encoder + linear head over the first token: (B, T) ids -> (B,) predicted PLL = -softplus(a) < 0."""

    def __init__(self, encoder: nn.Module, hidden_size: int, mean: float, std: float, seed: int = 0) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.head.weight, std=0.02, generator=torch.Generator().manual_seed(seed))
        nn.init.zeros_(self.head.bias)
        mean = min(mean, -1e-3)  # a teacher's mean PLL is below 0; a degenerate one still gets a finite offset
        offset = softplus_inverse(-mean)
        slope = 1.0 / (1.0 + math.exp(-offset))  # softplus' at the offset
        self.register_buffer("mean", torch.tensor(float(mean), dtype=torch.float64))
        self.register_buffer("std", torch.tensor(float(std), dtype=torch.float64))
        self.register_buffer("offset", torch.tensor(offset, dtype=torch.float64))
        self.register_buffer("scale", torch.tensor(std / slope, dtype=torch.float64))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B,) float64 predicted PLL, below 0 whatever the weights."""
        first = self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0][:, 0]  # (B, H)
        with torch.autocast(first.device.type, enabled=False):  # the head in its own dtype, as the LM head
            a = self.head(first.to(self.head.weight.dtype)).squeeze(1).double()  # (B,)
        return -F.softplus(self.offset - self.scale * a)


def regressor_for(mlm: MaskedLM, mean: float, std: float, seed: int = 0) -> SentenceRegressor:
    """A fresh `sentence` student on the masked LM's encoder (shared, not copied), its head drawn with `seed`
    in the LM head's dtype (float32, float64 for a model loaded in float64)."""
    regressor = SentenceRegressor(mlm.encoder, mlm.model.config.hidden_size, mean, std, seed).to(mlm.device)
    regressor.head.to(mlm.head_dtype)
    return regressor


def save_student(mlm: MaskedLM, folder: str | Path, info: dict, regressor: SentenceRegressor | None = None) -> None:
    """Write a student folder: the masked LM (fine-tuned, with its own head) and tokenizer, `maskless.json`
    (`info`: target, teacher, figures; the format and the tokenizer's digest added here) and, for a
    `sentence` student, its regression head."""
    folder = Path(folder)
    mlm.model.save_pretrained(folder)
    mlm.tokenizer.save_pretrained(folder)
    info = {**info, "format": STUDENT_FORMAT, "tokenizer_digest": tokenizer_digest(mlm.tokenizer)}
    if regressor is not None:
        head = {name: t.detach().cpu().contiguous() for name, t in regressor.head.state_dict().items()}
        save_file(head, str(folder / STUDENT_HEAD_FILE))
        info.update(
            head="-softplus of a linear map of the first token's final hidden state",
            mean=float(regressor.mean),
            std=float(regressor.std),
        )
    (folder / STUDENT_FILE).write_text(json.dumps(info, indent=2, sort_keys=True))


@dataclass
class Student:
    """A loaded maskless scorer: the masked LM (fine-tuned, or the base model for `unmasked`), the sentence
    head of a `sentence` student (None otherwise), its maskless.json (empty for `unmasked`), signature, and
    the map its predictions pass through (the identity for `unmasked` and uncalibrated students)."""

    mlm: MaskedLM
    regressor: SentenceRegressor | None
    info: dict
    signature: dict
    calibration: Calibration = UNCALIBRATED

    @property
    def per_token(self) -> bool:
        """Whether it predicts each scored token's term (token, distribution, unmasked), not only the sum."""
        return self.regressor is None


def load_student(spec: ModelSpec, calibrated: bool = True) -> Student:
    """Load a student folder (`save_student`) for inference: its predictions calibrated as its maskless.json
    says (uncalibrated where it records no calibration, or with `calibrated` False: what the calibration is
    fitted on)."""
    info = read_student_info(spec.name)
    mlm = load_masked_lm(spec)
    check_student_tokenizer(spec.name, info, mlm.tokenizer)
    regressor = None
    if info["target"] == TARGET_SENTENCE:
        regressor = regressor_for(mlm, info["mean"], info["std"])
        head = load_file(str(Path(spec.name).expanduser() / STUDENT_HEAD_FILE))
        regressor.head.load_state_dict({k: v.to(regressor.head.weight.dtype) for k, v in head.items()})
        regressor.eval()
    calibration = student_calibration(info) if calibrated else None
    signature = {
        **mlm.signature,
        "scorer": "maskless",
        "target": info["target"],
        "teacher": info.get("teacher"),
        "calibration": None if calibration is None else asdict(calibration),
    }
    return Student(mlm, regressor, info, signature, calibration or UNCALIBRATED)


def unmasked_scorer(spec: ModelSpec) -> Student:
    """The masked LM itself read unmasked (`--method unmasked`): a student before any training."""
    mlm = load_masked_lm(spec)
    return Student(mlm, None, {}, {**mlm.signature, "scorer": "unmasked"})


@dataclass(frozen=True)
class Prediction:
    """A sentence's predicted PLL and, for per-token scorers, its terms (float64, in target order)."""

    pll: float
    token_logprobs: np.ndarray | None


class MasklessEngine:
    """Predictions for prepared sentences, one forward pass each, packed under a token budget into batches of
    sentences of similar length (at most `ONE_PASS_PADDING` tokens run per real token); results do not depend
    on the batching. `work` adds up what the passes ran: batches, sentences, padded and real tokens."""

    def __init__(self, student: Student, batch_tokens: int | None = None) -> None:
        self.student = student
        self.budget = TokenBudget(batch_tokens or student.mlm.default_batch_tokens())
        self.work = Work()

    def predict(self, sentences: Sequence[Sentence]) -> list[Prediction]:
        """Each sentence's prediction, in input order. The batches' outputs stay on the device until the last
        batch has run and come to the host in one copy."""
        lengths = [len(s.input_ids) for s in sentences]
        done: list[int] = []  # the sentences in the order their outputs were kept
        values = OnDevice()
        for pieces in pack(lengths, [1] * len(lengths), self.budget, ONE_PASS_PADDING):
            for part, out in run_fitting(
                pieces,
                lengths,
                self.budget,
                lambda p: self._forward([sentences[q.group] for q in p]),
                CUDA_OUT_OF_MEMORY,
            ):
                done += [piece.group for piece in part]
                values.add(out)
                self.work += Work.of(part, lengths)
        return self._predictions(sentences, done, values.host())

    def _forward(self, sentences: list[Sentence]) -> torch.Tensor:
        """A batch's outputs on the device: (B,) PLLs (`sentence` students) or (Q,) terms, sentence by sentence."""
        ids, mask = padded([s.input_ids for s in sentences], self.student.mlm.pad_token_id)
        if self.student.regressor is not None:
            return self.forward_sentence(ids, mask)
        rows = np.concatenate([np.full(len(s.targets), r, dtype=np.int64) for r, s in enumerate(sentences)])
        positions = np.concatenate([s.targets for s in sentences]).astype(np.int64)
        return self.forward_tokens(ids, mask, rows, positions)

    def _predictions(self, sentences: Sequence[Sentence], done: list[int], values: np.ndarray) -> list[Prediction]:
        """The calibrated predictions in input order, from the outputs of the sentences `done`, in that order (a
        per-token student's terms calibrated one by one, their sum the PLL)."""
        calibration = self.student.calibration
        out: list[Prediction | None] = [None] * len(sentences)
        if self.student.regressor is not None:
            for index, pll in zip(done, values.tolist()):
                out[index] = Prediction(calibration.pll(pll, len(sentences[index].targets)), None)
            return out
        terms = calibration.terms(values)  # (Q,)
        for index, t in zip(done, np.split(terms, np.cumsum([len(sentences[i].targets) for i in done])[:-1])):
            out[index] = Prediction(float(t.sum()), t)
        return out

    @torch.inference_mode()
    def forward_sentence(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> torch.Tensor:
        """(B,) float64 predicted PLLs of a padded batch (`sentence` students), on the device."""
        mlm = self.student.mlm
        with mlm.autocast():
            return self.student.regressor(to_device(input_ids, mlm.device), to_device(attention_mask, mlm.device))

    def forward_tokens(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: np.ndarray, positions: np.ndarray
    ) -> torch.Tensor:
        """(Q,) log q(w | W) of the token at position `positions[i]` of row `rows[i]`, the batch unmasked, on
        the device; the LM head runs at those positions only."""
        labels = to_device(input_ids[rows, positions], self.student.mlm.device)  # (Q,)
        out, start = [], 0
        for logits in self.student.mlm.logits_at(input_ids, attention_mask, positions, rows):  # (C, V)
            chunk = labels[start : start + len(logits)]
            out.append(logits.gather(1, chunk[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1))
            start += len(logits)
        return torch.cat(out)


def padded(sequences: Sequence[np.ndarray], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(B, T) int64 ids right-padded with `pad_id` and their (B, T) attention mask, T the longest length."""
    width = max(len(s) for s in sequences)
    ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), width), dtype=np.int64)
    for row, s in enumerate(sequences):
        ids[row, : len(s)] = s
        mask[row, : len(s)] = 1
    return ids, mask
