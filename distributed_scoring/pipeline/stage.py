"""The base of every workload stage: it declares its columns, checks them, and does the Arrow plumbing.

A stage is built once per worker (its constructor loads the tokenizer or the model) and then called on
one shard's table at a time, in-process (`runner.py`) or on a Ray actor (`on_ray.py`). Every stage used
to turn the table into rows and its rows back into a table by hand; here that is done once, so that a
stage's own code is `process`: a list of row dicts in, a list of row dicts out.

Before `process` runs, the table must hold the columns the stage `reads` (a missing one is an error that
names the stage, the columns it lacks and those it found: a miswired pipeline fails on its first shard
with a message, not with a KeyError deep in a scorer). The rows `process` returns are built into a
table of the stage's `output_schema`, which must hold every column of that schema (other keys, such as
input columns a row was copied from, are left out) and no null where the schema says not null. Rows
whose ids may repeat (`--allow-duplicate-ids`) carry a `line` column: it is added to every stage's
output schema, so each stage keeps it in its rows (`schema.key`) and the rows stay keyed by id and line.

A score stage also says how far it has got with the table, through the `Report` it is called with (see
`progress`): `process` hands `self.report` to its engine, which calls it after each forward pass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Mapping, Sequence

import pyarrow as pa

from ..io import schema as S
from .progress import Report, ignore

Row = dict[str, Any]


class ColumnError(ValueError):
    """A stage was given a table without a column it reads, or made rows that break its output schema."""


class Stage(ABC):
    """Subclasses set `reads` (input column -> what the stage uses it for) and either `writes` (a fixed
    output schema) or `output_schema` (one that depends on the stage's options or the input's columns),
    and implement `process`."""

    reads: ClassVar[Mapping[str, str]]
    writes: ClassVar[pa.Schema | None] = None
    report: Report = staticmethod(ignore)  # how far `process` has got with the current table

    @abstractmethod
    def process(self, rows: list[Row]) -> list[Row]:
        """The output rows of one shard's input rows."""

    def output_schema(self, columns: Sequence[str]) -> pa.Schema:
        """The schema of the output for an input table with these columns; `writes` unless overridden."""
        if self.writes is None:
            raise NotImplementedError(f"{self.name} declares neither `writes` nor `output_schema`")
        return self.writes

    @property
    def name(self) -> str:
        return type(self).__name__

    def __call__(self, table: pa.Table, report: Report = ignore) -> pa.Table:
        missing = [column for column in self.reads if column not in table.column_names]
        if missing:
            needs = "; ".join(f"{column!r}: {self.reads[column]}" for column in missing)
            raise ColumnError(
                f"stage {self.name} reads columns missing from its input table ({needs}); "
                f"the table has {table.column_names}"
            )
        schema = self.output_schema(table.column_names)
        if S.LINE in table.column_names and S.LINE not in schema.names:
            schema = schema.append(S.LINE_FIELD)  # the rows' key goes on: `process` keeps it (`schema.key`)
        self.report = report
        return self._table(self.process(table.to_pylist()), schema)

    def _table(self, rows: list[Row], schema: pa.Schema) -> pa.Table:
        """`rows` as a table of `schema`, refused when a row lacks one of its columns (pyarrow would make
        it null) or a not-null column holds a null (pyarrow would write it)."""
        names = set(schema.names)
        for row in rows:
            if not row.keys() >= names:
                raise ColumnError(
                    f"stage {self.name} made a row without the columns "
                    f"{sorted(names - row.keys())} of its output schema; the row has {list(row)}"
                )
        table = pa.Table.from_pylist(rows, schema=schema)
        nulls = [f.name for f in schema if not f.nullable and table.column(f.name).null_count]
        if nulls:
            raise ColumnError(f"stage {self.name} made nulls in its not-null columns {nulls}")
        return table
