"""The base of every error meant for the user: bad input, options, model or output folder.

The CLI prints these as one line and exits 2; anything else is a bug and keeps its traceback.
"""


class UserError(ValueError):
    """A problem the user can fix; the message names the value seen and what to do."""


class DataLossError(RuntimeError):
    """Rows in != rows out: some shard is missing or incomplete. Rerunning the same command finishes it."""
