"""Maskless scoring (Salazar et al., 2020, sec. 2.2 and 3.6): a sentence's PLL predicted in one forward pass.

A PLL costs one masked copy per token and a softmax over the vocabulary for each; the student reads the
sentence once, unmasked, and a linear map of the hidden state at its first token ([CLS], <s>) regresses
the teacher's PLL. The encoder starts from the masked LM itself (`dscore train maskless` finetunes it).

The regression runs on standardised targets, z = (PLL - mean) / std, with the teacher's mean and std on
the training split kept in the module (buffers): PLLs are sums over tokens, tens to hundreds of nats, and a
head that starts near 0 would spend its first steps learning the offset. The loss, |z - z_hat|^2, is the
paper's |PLL - q(W)|^2 divided by a constant, so it has the same minimiser.

A student folder is an ordinary masked-LM folder (the finetuned encoder with the MLM's head, and the
tokenizer: `load_masked_lm` reads it) plus `maskless.json` and the head's weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..config import ModelSpec
from .model_files import STUDENT_FILE, STUDENT_FORMAT, STUDENT_HEAD_FILE, read_student_info
from .models import CUDA_OUT_OF_MEMORY, MaskedLM, load_masked_lm, to_device
from .packing import Piece, TokenBudget, pack, run_fitting


class MasklessRegressor(nn.Module):
    """Encoder + linear head over the first token: (B, T) ids -> (B,) standardised PLL z."""

    def __init__(self, encoder: nn.Module, hidden_size: int, mean: float = 0.0, std: float = 1.0, seed: int = 0) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.head.weight, std=0.02, generator=torch.Generator().manual_seed(seed))
        nn.init.zeros_(self.head.bias)
        self.register_buffer("mean", torch.tensor(float(mean), dtype=torch.float64))
        self.register_buffer("std", torch.tensor(float(std), dtype=torch.float64))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        first = self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0][:, 0]  # (B, H)
        with torch.autocast(first.device.type, enabled=False):  # the head in its own dtype, as the LM head
            return self.head(first.to(self.head.weight.dtype)).squeeze(1)  # (B,)

    def to_pll(self, z: torch.Tensor) -> torch.Tensor:
        """Standardised predictions back on the teacher's scale (float64)."""
        return self.mean + self.std * z.double()

    def standardise(self, pll: torch.Tensor) -> torch.Tensor:
        return ((pll.double() - self.mean) / self.std).float()


def regressor_for(mlm: MaskedLM, mean: float, std: float, seed: int = 0) -> MasklessRegressor:
    """A fresh student initialised from the masked LM's encoder (shared, not copied) and a head drawn with
    `seed`; the head in the LM head's dtype (float32, float64 for a model loaded in float64)."""
    regressor = MasklessRegressor(mlm.encoder, mlm.model.config.hidden_size, mean, std, seed).to(mlm.device)
    regressor.head.to(mlm.head_dtype)
    return regressor


def save_student(regressor: MasklessRegressor, mlm: MaskedLM, folder: str | Path, meta: dict) -> None:
    """Write a student folder: the masked LM (finetuned encoder, its own head) and tokenizer, the
    regression head, and `maskless.json` (format, target scale and `meta`: what it was trained on)."""
    folder = Path(folder)
    mlm.model.save_pretrained(folder)
    mlm.tokenizer.save_pretrained(folder)
    head = {name: t.detach().cpu().contiguous() for name, t in regressor.head.state_dict().items()}
    save_file(head, str(folder / STUDENT_HEAD_FILE))
    info = {"format": STUDENT_FORMAT, "head": "linear over the first token's final hidden state",
            "mean": float(regressor.mean), "std": float(regressor.std), **meta}
    (folder / STUDENT_FILE).write_text(json.dumps(info, indent=2, sort_keys=True))


@dataclass
class Student:
    """A loaded maskless scorer: the masked LM it was finetuned from (encoder, tokenizer, device) and its head."""

    mlm: MaskedLM
    regressor: MasklessRegressor
    info: dict
    signature: dict


def load_student(spec: ModelSpec) -> Student:
    """Load a student folder (`save_student`) for inference."""
    info = read_student_info(spec.name)
    mlm = load_masked_lm(spec)
    regressor = regressor_for(mlm, info["mean"], info["std"])
    head = load_file(str(Path(spec.name).expanduser() / STUDENT_HEAD_FILE))
    regressor.head.load_state_dict({k: v.to(regressor.head.weight.dtype) for k, v in head.items()})
    regressor.eval()
    signature = {**mlm.signature, "scorer": "maskless", "teacher": info.get("teacher")}
    return Student(mlm, regressor, info, signature)


class MasklessEngine:
    """Predicted PLLs of token sequences, one forward pass per sentence, packed under a token budget."""

    def __init__(self, student: Student, batch_tokens: int | None = None) -> None:
        self.student = student
        self.budget = TokenBudget(batch_tokens or student.mlm.default_batch_tokens())

    def predict(self, sequences: Sequence[np.ndarray]) -> np.ndarray:
        """(N,) float64 predicted PLL of each sequence of token ids (special tokens included)."""
        out = np.empty(len(sequences), dtype=np.float64)
        lengths = [len(s) for s in sequences]
        for pieces in pack(lengths, [1] * len(lengths), self.budget):
            for part, values in run_fitting(pieces, lengths, self.budget,
                                            lambda p: self._forward(sequences, p), CUDA_OUT_OF_MEMORY):
                out[[piece.group for piece in part]] = values
        return out

    def _forward(self, sequences: Sequence[np.ndarray], pieces: list[Piece]) -> np.ndarray:
        ids, mask = padded([sequences[p.group] for p in pieces], self.student.mlm.pad_token_id)
        return self.forward(ids, mask).cpu().numpy()

    @torch.inference_mode()
    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> torch.Tensor:
        """(B,) float64 predicted PLLs of a padded batch."""
        mlm = self.student.mlm
        ids, mask = to_device(input_ids, mlm.device), to_device(attention_mask, mlm.device)  # (B, T)
        with mlm.autocast():
            z = self.student.regressor(ids, mask)  # (B,)
        return self.student.regressor.to_pll(z)


def padded(sequences: Sequence[np.ndarray], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(B, T) int64 ids right-padded with `pad_id` and their (B, T) attention mask, T the longest length."""
    width = max(len(s) for s in sequences)
    ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), width), dtype=np.int64)
    for row, s in enumerate(sequences):
        ids[row, : len(s)] = s
        mask[row, : len(s)] = 1
    return ids, mask
