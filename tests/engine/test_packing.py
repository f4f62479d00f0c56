"""The shared packer and its out-of-memory halving: invariants on random shapes, then each engine's use."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.causal import CausalEngine, encode, load_causal_lm
from distributed_scoring.engine.conditionals import ConditionalsEngine, Pair
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.packing import OutOfMemory, Piece, TokenBudget, pack, rows_of, run_fitting
from distributed_scoring.workloads.causal import score_texts
from distributed_scoring.workloads.prepare import PLLPreparer

from helpers import rescoring as H
from helpers import tiny


class FakeOutOfMemory(Exception):
    pass


FAKE = OutOfMemory(FakeOutOfMemory, lambda: None)


def random_groups(seed: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 60, size=80).tolist(), rng.integers(0, 12, size=80).tolist()


def width(batch: list[Piece], lengths: list[int]) -> int:
    return lengths[batch[0].group]


@pytest.mark.parametrize("budget", [1, 7, 50, 333, 10**6])
def test_pack_covers_every_row_once_longest_first_under_the_budget(budget):
    lengths, counts = random_groups(budget)
    batches = list(pack(lengths, counts, TokenBudget(budget)))
    seen = [(p.group, row) for batch in batches for p in batch for row in range(p.start, p.end)]
    assert sorted(seen) == [(g, r) for g in range(len(lengths)) for r in range(counts[g])]
    assert len(seen) == len(set(seen))
    order = [lengths[p.group] for batch in batches for p in batch]
    assert order == sorted(order, reverse=True)  # longest first, within and across batches
    for batch in batches:
        assert all(p.rows > 0 for p in batch)
        assert max(lengths[p.group] for p in batch) == width(batch, lengths)
        assert rows_of(batch) == 1 or rows_of(batch) * width(batch, lengths) <= budget
    # Batches are full: only the last one may hold fewer rows than the budget allows.
    for batch in batches[:-1]:
        assert rows_of(batch) == max(1, budget // width(batch, lengths))


def test_a_row_longer_than_the_budget_goes_alone():
    batches = list(pack([10, 50, 3], [2, 3, 4], TokenBudget(20)))
    assert batches[:3] == [[Piece(1, 0, 1)], [Piece(1, 1, 2)], [Piece(1, 2, 3)]]
    assert batches[3:] == [[Piece(0, 0, 2)], [Piece(2, 0, 4)]]


def test_pack_ignores_empty_groups_and_inputs():
    assert list(pack([], [], TokenBudget(10))) == []
    assert list(pack([5, 4], [0, 2], TokenBudget(100))) == [[Piece(1, 0, 2)]]


def test_a_halved_budget_applies_to_the_batches_after():
    budget = TokenBudget(40)
    batches = pack([10] * 4, [4] * 4, budget)
    assert rows_of(next(batches)) == 4
    budget.halve()
    assert [rows_of(b) for b in batches] == [2] * 6


def fitting(lengths: list[int], limit: int, calls: list[int]):
    """A fake forward that runs out of memory above `limit` tokens and returns its rows as (group, row)."""

    def forward(batch: list[Piece]) -> list[tuple[int, int]]:
        tokens = rows_of(batch) * width(batch, lengths)
        calls.append(tokens)
        if tokens > limit:
            raise FakeOutOfMemory(f"{tokens} tokens")
        return [(p.group, row) for p in batch for row in range(p.start, p.end)]

    return forward


def test_out_of_memory_halves_the_budget_and_retries_in_parts(caplog):
    lengths, counts = random_groups(0)
    budget, calls = TokenBudget(400), []
    forward = fitting(lengths, 90, calls)
    done = []
    with caplog.at_level(logging.WARNING, logger="distributed_scoring.engine.packing"):
        for batch in pack(lengths, counts, budget):
            for part, rows in run_fitting(batch, lengths, budget, forward, FAKE):
                assert rows == [(p.group, r) for p in part for r in range(p.start, p.end)]
                done += rows
    assert done == [
        (p.group, r) for b in pack(lengths, counts, TokenBudget(400)) for p in b for r in range(p.start, p.end)
    ]
    assert max(calls) > 90 and budget.tokens <= 90
    assert "token budget halved" in caplog.text


def test_a_single_row_that_does_not_fit_is_an_error():
    budget = TokenBudget(100)
    with pytest.raises(FakeOutOfMemory):
        run_fitting([Piece(0, 0, 1)], [50], budget, fitting([50], 10, []), FAKE)
    with pytest.raises(FakeOutOfMemory):
        run_fitting([Piece(0, 0, 2)], [50], budget, fitting([50], 10, []), FAKE)


def test_other_errors_are_not_retried():
    def forward(batch: list[Piece]) -> None:
        raise ValueError("not memory")

    budget = TokenBudget(100)
    with pytest.raises(ValueError):
        run_fitting([Piece(0, 0, 4)], [5], budget, forward, FAKE)
    assert budget.tokens == 100


def oom(message: str) -> torch.cuda.OutOfMemoryError:
    return torch.cuda.OutOfMemoryError(f"CUDA out of memory (simulated: {message})")


def test_causal_engine_retries_out_of_memory_batches(tmp_path, monkeypatch):
    lm = load_causal_lm(ModelSpec(str(H.save_tiny_causal("gpt2", tmp_path / "gpt2"))))
    texts = tiny.CORPUS[:6]
    expected = score_texts(CausalEngine(lm, 10**4), texts)
    engine = CausalEngine(lm, 10**4)
    forward, sizes = engine.forward, []
    limit = 2 * max(len(ids) for ids in encode(lm, texts))  # two rows fit, six do not

    def forward_with_memory_limit(input_ids, lengths):
        sizes.append(input_ids.size)
        if input_ids.size > limit:
            raise oom(f"{input_ids.size} tokens")
        return forward(input_ids, lengths)

    monkeypatch.setattr(engine, "forward", forward_with_memory_limit)
    got = score_texts(engine, texts)
    assert max(sizes) > limit and engine.budget.tokens < 10**4
    np.testing.assert_allclose(got["logp"].to_numpy(), expected["logp"].to_numpy(), rtol=0, atol=1e-5)


def test_conditionals_engine_retries_out_of_memory_batches(tiny_model_dir, monkeypatch):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    examples = [(tiny.CORPUS[0], 0, 1), ("Naïve café owners", 2, 0)]
    prepared = PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts([text for text, _, _ in examples])
    pairs = [Pair(np.array(p.input_ids), np.array(p.targets), a, b) for p, (_, a, b) in zip(prepared, examples)]
    expected = dict(ConditionalsEngine(mlm, 10**4, top_k=4).conditionals(pairs))
    engine = ConditionalsEngine(mlm, 10**4, top_k=4)
    forward, sizes = engine._forward, []

    def forward_with_memory_limit(input_ids, attention_mask, positions):
        sizes.append(input_ids.size)
        if input_ids.size > 100:
            raise oom(f"{input_ids.size} tokens")
        return forward(input_ids, attention_mask, positions)

    monkeypatch.setattr(engine, "_forward", forward_with_memory_limit)
    got = dict(engine.conditionals(pairs))
    assert sorted(got) == sorted(expected) == [0, 1]
    assert max(sizes) > 100 and engine.budget.tokens < 10**4
    for index, conditionals in got.items():
        for name in ("log_a_given_b", "log_b_given_a", "log_a", "log_b", "support_a", "support_b"):
            torch.testing.assert_close(getattr(conditionals, name), getattr(expected[index], name), rtol=0, atol=1e-5)
