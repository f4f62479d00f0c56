"""Options declared once: a field of an options (or engine settings) dataclass carries its flag in its
metadata, its help, choices and bounds, so that the class checks itself from that declaration (`check`),
the CLI derives the flag and reads the options back from it (`cli.common.add_options`, `options_from`),
and a workload's options take an engine's field by name (`carried`) instead of spelling it again.

Torch-free and free of the CLI, so that engine settings, workloads and commands all declare through it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .errors import UserError


def check_bounds(
    flag: str, value: float | None, low: float, high: float | None = None, above: bool = False, below: bool = False
) -> None:
    """Refuse an absurd value of the option `flag` in one line that names its bounds: not a finite number,
    under `low` (or equal to it, with `above`) or over `high` (or equal to it, with `below`). None, an
    option left at its default, passes. The bounds are the ones each command's page documents."""
    if value is None:
        return
    ok = (
        math.isfinite(value)
        and (value > low or (value == low and not above))
        and (high is None or value < high or (value == high and not below))
    )
    if not ok:
        finite = "" if math.isfinite(value) else "a finite number "
        raise UserError(
            f"{flag} {_shown(value)} is out of bounds: it must be {finite}{_bounds(low, high, above, below)}"
        )


def _shown(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _bounds(low: float, high: float | None, above: bool, below: bool) -> str:
    if high is not None:
        return f"in {'(' if above else '['}{_shown(low)}, {_shown(high)}{')' if below else ']'}"
    return f"{'above' if above else 'at least'} {_shown(low)}"


ADDED_LATER = {"recorded": "when set"}
"""Metadata of a field added to a record after folders (or audit.json files) were written without it:
`io.output.recorded_values` leaves it out while it holds its default, so those folders still resume."""


def added_later(f: dataclasses.Field) -> bool:
    return f.metadata.get("recorded") == ADDED_LATER["recorded"]


@dataclass(frozen=True)
class Flag:
    """How one option reads on the command line and which values it admits.

    `help` may name the field's default as `{default}`. `low`/`high` bound a number (`above`: `low`
    excluded, `below`: `high` excluded), as `check_bounds` says; `choices` list its names (a field
    that also takes a number, such as HCB's pivot, a token id, checks the number itself). `name` is the flag
    when it is not the field's name with dashes; `type` parses the flag's text (default: the type of the
    field's default); `read` turns the parsed value into the option's (a space-separated list into a tuple,
    say)."""

    help: str
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    above: bool = False
    below: bool = False
    name: str | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    read: Callable[[Any], Any] | None = None


def option(default: Any, help: str, *, later: bool = False, **flag: Any) -> Any:
    """A dataclass field declared with its flag (`Flag`'s keywords); `later`: added after folders were
    written without it (`ADDED_LATER`)."""
    metadata = {"flag": Flag(help, **flag), **(ADDED_LATER if later else {})}
    return field(default=default, metadata=metadata)


def carried(source: type, name: str, /, *, later: bool = False, **changes: Any) -> Any:
    """Field `name` of `source` (an engine's settings) declared again on an options class: the same default,
    help, choices and bounds, with `changes` to its flag (a different flag name, say)."""
    f = {f.name: f for f in dataclasses.fields(source)}[name]
    metadata = {**f.metadata, **(ADDED_LATER if later else {})}
    if changes:
        metadata["flag"] = dataclasses.replace(metadata["flag"], **changes)
    return field(default=f.default, metadata=metadata)


def flagged(options: Any) -> Iterator[tuple[dataclasses.Field, Flag]]:
    """The fields of an options class (or instance) that are flags, in declaration order, with their flag."""
    for f in dataclasses.fields(options):
        if "flag" in f.metadata:
            yield f, f.metadata["flag"]


def flag_name(f: dataclasses.Field, spec: Flag) -> str:
    return spec.name or "--" + f.name.replace("_", "-")


def check(options: Any) -> None:
    """Refuse a value outside its field's declared choices or bounds, in one line that names the flag."""
    for f, spec in flagged(options):
        value = getattr(options, f.name)
        if spec.choices is not None and isinstance(value, str) and value not in spec.choices:
            raise UserError(f"{flag_name(f, spec)} {value!r} is not one of {', '.join(spec.choices)}")
        if spec.low is not None:
            check_bounds(flag_name(f, spec), value, spec.low, spec.high, spec.above, spec.below)


def by_name(cls: type, source: Any, **given: Any) -> Any:
    """An instance of `cls` whose fields take the values of `source`'s fields of the same name (`given`
    overriding): options built from an engine's settings or settings from options, spelled once."""
    have = {f.name for f in dataclasses.fields(source)}
    values = {f.name: getattr(source, f.name) for f in dataclasses.fields(cls) if f.name in have}
    return cls(**(values | given))


def words(text: str | None) -> tuple[str, ...] | None:
    """A flag's space-separated list as a tuple (`--vocab-restrict "A C D"`); None when empty or not given."""
    return tuple(text.split()) if text else None
