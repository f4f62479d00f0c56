"""What runs on each shard: a workload's prepare and score stages, built once per worker.

Both executions (in-process in `runner.py`, Ray actors in `on_ray.py`) take a `Workload`, so a new
kind of scoring (PLL, causal-LM log-probabilities, pairwise joints) brings its name, its options
dataclass and its two stage factories (each stage a `stage.Stage`, or a plain function that passes rows
through), and reuses reading, sharding, writing, resume and fault tolerance unchanged: the run's
fingerprint comes from the name and options (`output.fingerprint`).
Factories must be picklable (module-level functions and `functools.partial` of them), since Ray ships
them to its workers.

What the code around a workload would otherwise hard-code about it, it declares once in its module
(`Declaration`, found by `workloads.registered`): its row key (recorded in `_run.json`, read by `dscore
verify`), its torch engine modules (which the driver may never import) and its documentation page. Its
factory builds each run's `Workload` from that declaration (`DECLARED.workload(...)`), which gives the
name and the row key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import pyarrow as pa

from ..config import RowCost
from .progress import Report


class ShardScorer(Protocol):
    """A score stage: prepared rows in, output rows out, and the signature its markers record; it tells
    `report` how far it has got as it goes (`pipeline.stage.Stage` does the plumbing)."""

    signature: dict

    def __call__(self, prepared: pa.Table, report: Report = ...) -> pa.Table: ...


@dataclass(frozen=True)
class Declaration:
    """What a workload says about itself, once, in its module (`DECLARED`): its `name` (the run's, or its
    prefix), the `engines` that are its torch code (modules under the package, `engine.x`), its `docs` page
    (relative to the repository) and its `row_key`: the columns that, with `id`, tell its rows apart when it
    writes several rows per input row (none when it writes one). `output` gives the schema of its rows under
    default options, which its command's --help lists (`workflows.columns`)."""

    name: str
    engines: tuple[str, ...]
    docs: str
    row_key: tuple[str, ...] = ()
    output: Callable[[], pa.Schema] | None = None

    def workload(
        self,
        options: Any,
        make_preparer: Callable[[], Callable[[pa.Table], pa.Table]],
        make_scorer: Callable[[], ShardScorer],
        device: str,
        rows_per_input: int = 1,
        name: str | None = None,
        row_cost: RowCost | None = None,
    ) -> Workload:
        """A run of this workload, under this declaration's name and row key; `name` when the run's is another
        (a kind of it, `joints-random`, or its other name, `unmasked`)."""
        return Workload(
            name or self.name, options, make_preparer, make_scorer, device, rows_per_input, self.row_key, row_cost
        )


@dataclass(frozen=True)
class Workload:
    """`name` and `options` (a frozen dataclass of what changes the results, every field) make the run's
    fingerprint; `device` sizes the Ray actors (see resources.plan_resources); `rows_per_input` is how
    many output rows each input row becomes (the no-loss check counts them); `row_key` the columns that,
    with `id`, key its rows (`_run.json` records them); `row_cost`, what scoring a row costs, by which the
    default shards are cut (`sizing`; None: by rows). A workload's factory builds it from its
    `Declaration` (`DECLARED.workload`), which gives `name` and `row_key`; a workload of no module (a test's,
    a benchmark's) is built directly."""

    name: str
    options: Any
    make_preparer: Callable[[], Callable[[pa.Table], pa.Table]]
    make_scorer: Callable[[], ShardScorer]
    device: str
    rows_per_input: int = 1
    row_key: tuple[str, ...] = ()
    row_cost: RowCost | None = None
