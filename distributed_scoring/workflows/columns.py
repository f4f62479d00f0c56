"""The columns of the rows a workload writes, named from its declared schema for its command's --help, so
that the help cannot drift from what a run writes."""

from __future__ import annotations

import pyarrow as pa

from ..workloads import registered


def columns(workload: str) -> str:
    """The columns of `workload`'s rows under default options, in order; a struct's fields (or a list of
    structs') in brackets: `beams (tokens, text, score)`."""
    declared = registered()[workload]
    if declared.output is None:
        raise ValueError(f"the workload {workload!r} declares no output schema")
    return ", ".join(_named(field) for field in declared.output())


def _named(field: pa.Field) -> str:
    kind = field.type.value_type if pa.types.is_list(field.type) else field.type
    if pa.types.is_struct(kind):
        return f"{field.name} ({', '.join(kind.field(i).name for i in range(kind.num_fields))})"
    return field.name
