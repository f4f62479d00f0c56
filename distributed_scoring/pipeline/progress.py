"""Progress on long work: a bar on an interactive terminal, periodic rows/s log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

logger = logging.getLogger(__name__)


class Progress:
    """Counts rows done out of `total`; logs every `every_s` seconds when no bar is shown (jobs, CI)."""

    def __init__(self, total: int, what: str = "rows", every_s: float = 30.0, bar: bool | None = None) -> None:
        self.total = total
        self.what = what
        self.every_s = every_s
        self.done = 0
        self.started = self.last_log = time.monotonic()
        show_bar = sys.stderr.isatty() if bar is None else bar
        self.bar = tqdm(total=total, unit=what, dynamic_ncols=True) if show_bar else None

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self.last_log >= self.every_s or self.done >= self.total:
            self.last_log = now
            logger.info("%d/%d %s (%.1f %s/s)", self.done, self.total, self.what, self.rate(), self.what)

    def rate(self) -> float:
        return self.done / max(time.monotonic() - self.started, 1e-9)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
