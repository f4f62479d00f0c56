"""Row ids are keys: two input records with one id are refused before any work, unless the user says so.

Scores are joined to what they score by id (resume, verify, rescoring, audits against a baseline), so a
repeated id would mix rows silently. Ids made by dscore (`<file>:<record>`) are unique by construction;
ids read from an `--id-column` are checked here, on the driver, before any shard is scored: each shard's
ids are read as the pipeline will make them (`sources.shard_ids`: `1` and `"1"` in JSON Lines are one
id) and kept as Arrow strings, and the repeated ones are found with Arrow's hash kernels, with no Python
object per row: memory holds the ids alone (about 20 bytes a row).

`--allow-duplicate-ids` says the repetition is meant: the rows then carry a `line` column (`<file>:
<record>`, where the row was read, as a made id would name it) and are keyed by `id` with `line`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..config import InputSpec
from .inputs import InputError
from .sources import Shard, read_units, shard_ids

SHOWN = 3  # repeated ids named in a refusal, each with its first two places


class DuplicateIdError(InputError):
    """Two or more input records share an id; the message names the first ones and where they are."""


def check_unique_ids(plan: list[Shard], spec: InputSpec) -> None:
    """Refuse the run when two records of the planned shards share an id (see the module docstring)."""
    if spec.id_column is None or spec.allow_duplicate_ids:
        return
    chunks: list[pa.Array] = []
    shards: list[Shard] = []
    for unit in read_units(plan):
        for shard, ids in shard_ids(unit, spec):
            shards.append(shard)
            chunks.append(ids)
    starts = np.cumsum([0, *(len(c) for c in chunks)])[:-1]

    def place(index: int) -> str:
        i = int(np.searchsorted(starts, index, side="right")) - 1
        number = shards[i].start + index - int(starts[i]) + 1
        return f"{shards[i].file.name} {'line' if shards[i].file.fmt in ('text', 'jsonl') else 'row'} {number}"

    refuse_repeated(
        pa.chunked_array(chunks, pa.string()),
        place,
        f"--id-column {spec.id_column!r}",
        "make the ids unique, leave out --id-column (ids become file:line), or pass "
        "--allow-duplicate-ids to keep them (rows are then keyed by id and line)",
    )


def refuse_repeated(ids: pa.ChunkedArray, place: Callable[[int], str], source: str, fix: str) -> None:
    """Raise `DuplicateIdError` when a value of `ids` repeats, naming the first repeated ones (in input
    order) at their first two places (`place(index)`), then `fix`."""
    counts = pc.value_counts(ids)
    repeated = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    if len(repeated) == 0:
        return
    shown: dict[str, list[str]] = {}
    wanted = min(SHOWN, len(repeated))
    for index in np.flatnonzero(pc.is_in(ids, value_set=repeated).to_numpy(zero_copy_only=False)):
        value = ids[int(index)].as_py()
        if value in shown or len(shown) < wanted:
            found = shown.setdefault(value, [])
            if len(found) < 2:
                found.append(place(int(index)))
        if len(shown) == wanted and all(len(p) == 2 for p in shown.values()):
            break
    named = "; ".join(f"{value!r} at {' and '.join(where)}" for value, where in shown.items())
    more = f" (and {len(repeated) - len(shown)} more)" if len(repeated) > len(shown) else ""
    counted = "1 id" if len(repeated) == 1 else f"{len(repeated)} ids"
    raise DuplicateIdError(
        f"{counted} of {source} {'repeats' if len(repeated) == 1 else 'repeat'}: {named}{more}. Rows are keyed by "
        f"their id, so repeated ids would mix them: {fix}"
    )
