"""`workloads.pll.isolated`: a row that fails on its own becomes an error row; a failure of all is raised."""

from __future__ import annotations

import pytest

from distributed_scoring.workloads.pll import isolated


def lengths(items: list[str]) -> list[int]:
    if "bad" in items:
        raise RuntimeError("boom")
    return [len(i) for i in items]


def test_a_failing_item_gets_its_error_and_the_others_their_scores():
    assert isolated(lengths, ["a", "bad", "ccc"]) == [1, "scoring failed: RuntimeError: boom", 3]
    assert isolated(lengths, ["bad"]) == ["scoring failed: RuntimeError: boom"]
    assert isolated(lengths, []) == []


def test_a_failure_that_hits_every_item_is_raised():
    with pytest.raises(RuntimeError, match="boom"):
        isolated(lengths, ["bad", "bad"])
