"""The CLI's flags named as the API's keyword arguments in the messages of the `UserError`s that the
configs, workloads and engines the two share raise."""

from __future__ import annotations

import functools
import re
from typing import Any, Callable

from ..errors import UserError

# A CLI flag in a message from the layers the CLI shares with this API (`--device=cpu`, `--order 'x'`,
# `--top 5`, `--free-all`), and the value that goes with it.
_FLAG = re.compile(r"--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?:=([\w:.-]+)| ('[^']*')| (-?\d+(?:,\d{3})*(?:\.\d+)?)\b)?")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def python_names(message: str) -> str:
    """`message` with the CLI's flags named as this API's keyword arguments: `--device=cpu` becomes
    `device="cpu"`, `--order 'x'` `order='x'`, `--top 5` `top=5`, `--free-all` `free_all`."""

    def named(flag: re.Match) -> str:
        name, given, quoted, number = flag[1].replace("-", "_"), flag[2], flag[3], flag[4]
        if given is not None:
            return f"{name}={given}" if _NUMBER.fullmatch(given) else f'{name}="{given}"'
        value = quoted if quoted is not None else number.replace(",", "") if number is not None else None
        return name if value is None else f"{name}={value}"

    return _FLAG.sub(named, message)


def python_errors(method: Callable) -> Callable:
    """`method` raising its `UserError`s with Python's names for the options: the messages come from the
    configs, workloads and engines the CLI shares, which name them as flags."""

    @functools.wraps(method)
    def named(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except UserError as exc:
            exc.args = (python_names(str(exc)), *exc.args[1:])
            raise

    return named
