"""The `dscore` console script. A stop before the command has begun ends in its one line too.

Importing the CLI (argparse, pyarrow, the commands) takes a second or more on a busy machine; a SIGTERM there
ended the process with no word (the signal's default action) and a Ctrl-C with a KeyboardInterrupt
traceback. Nothing is claimed or written yet, so the line and the exit code are all a stop needs until
`stopping.stopping_on_signals` takes over, as the command starts. Once the command has returned, its
result stands: a signal then is ignored (while the interpreter shuts down, Python restores the default
action, which ended a finished run with no word and no exit code of its own).
"""

from __future__ import annotations

import signal
import sys

from . import stopping


def run() -> None:
    stopping.before_start()
    from .cli import main

    code = main()
    for signum in stopping.SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    sys.exit(code)
