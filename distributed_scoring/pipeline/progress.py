"""Progress a person can watch: rows done, rows/s and an ETA, while the shards are scored.

One display per run: a tqdm bar on an interactive terminal, else a log line at least every `every_s`
seconds (jobs, CI, files). A shard's rows count in full once its file is written; while it is scored,
its score stage says how far it has got through a `Report` (units done out of units in all, in whatever
its engine counts: masked copies, beam steps, sampler steps), and the display moves by that fraction of
the shard's rows, in fractions of a row (`3.4/24 rows`). So a shard that takes minutes, even a single row
that does (a long protein scored on two cores), shows progress after every forward pass, not only at its end.
Until the first forward pass is done the line says what it waits for and for how long: starting Ray's
actors and loading the model on them can take a minute. The rate and the ETA leave that start and the
first, slower forward passes out: until the run has gone at its own pace for a few seconds the line says
`ETA after warm-up` (a rate taken from the first passes once read "ETA 23:58" for a run of 4:19). Where
the forward passes themselves grow several times slower than the run's first ones (`Pace`: torch's
threads fighting other work for the CPUs), the display says so once, with what to do.
"""

from __future__ import annotations

import logging
import math
import statistics
import sys
import time
from collections import deque
from typing import Callable

from tqdm import tqdm

logger = logging.getLogger(__name__)

Report = Callable[[int, int], None]
"""What a score stage calls as it goes: (units done, units in all) of the shard it is scoring."""

EVERY_S = 10.0  # the longest a run without a bar stays silent while rows are being done
WAITING = "waiting for the first forward pass"
# A process's forward passes: the first WARM_PASSES are not timed (allocations, lazy initialisation),
# the next BASELINE_PASSES are its pace when the run began, and once the median of its latest
# RECENT_PASSES is COLLAPSE_RATIO times theirs, the pace has collapsed. A forward pass is packed up to the
# same token budget all run long, so its time stays about the same: sentence lengths alone do not make it 5-fold.
WARM_PASSES, BASELINE_PASSES, RECENT_PASSES = 2, 5, 5
COLLAPSE_RATIO = 5.0
# The display's rate, for the same reason, starts at its WARM_PASSES-th move (a forward pass in process, a
# shard or an actor's post on Ray) and is shown, with an ETA, once it spans RATE_MIN_S seconds and more rows.
RATE_MIN_S = 5.0
WARMING = "ETA after warm-up"


def ignore(done: int, total: int) -> None:
    """The `Report` of a stage whose caller does not watch its progress."""


def rows_done(rows: int, done: int, total: int) -> float:
    """The rows of a shard of `rows` rows that `done` units out of `total` stand for, fractions included."""
    return rows * min(max(done, 0), total) / total if total > 0 else 0.0


def count(rows: float) -> str:
    """`1,200` for whole rows (and from a thousand on), `3.4` for a part-done one: rounded down, so that
    what is not done never reads as done."""
    if rows == int(rows) or rows >= 1000:
        return f"{int(rows):,}"
    return f"{math.floor(rows * 10) / 10:.1f}"


def part(report: Report, index: int, parts: int) -> Report:
    """The `Report` of part `index` of `parts` equal parts of one shard's work (a stage that calls its
    engine more than once per shard)."""
    return lambda done, total: report(index * total + done, parts * total)


class Pace:
    """The time of this process's forward passes against its first ones: `watch` a shard's `Report` (each
    call ends a forward pass; the first one of a shard is timed from the watch's start), and the first
    time the latest passes are COLLAPSE_RATIO times slower than the first, `on_collapse` gets a warning
    that says so and what to do. `threads`: torch's intra-op threads here (None where unknown); `fix`:
    how to give the run fewer threads where it runs."""

    def __init__(self, on_collapse: Callable[[str], None], threads: int | None, fix: str) -> None:
        self.on_collapse, self.threads, self.fix = on_collapse, threads, fix
        self.passes = 0
        self.baseline: list[float] = []
        self.recent: deque[float] = deque(maxlen=RECENT_PASSES)
        self.warned = False

    def watch(self, report: Report) -> Report:
        """`report`, timing each call since the one before (or since now, for the first)."""
        last = [time.monotonic()]

        def timed(done: int, total: int) -> None:
            now = time.monotonic()
            self.passed(now - last[0])
            last[0] = now
            report(done, total)

        return timed

    def passed(self, seconds: float) -> None:
        """One forward pass took `seconds`."""
        self.passes += 1
        if self.passes <= WARM_PASSES:
            return
        if len(self.baseline) < BASELINE_PASSES:
            self.baseline.append(seconds)
            return
        self.recent.append(seconds)
        if self.warned or len(self.recent) < RECENT_PASSES:
            return
        first, now = statistics.median(self.baseline), statistics.median(self.recent)
        if now > COLLAPSE_RATIO * first:
            self.warned = True
            self.on_collapse(collapse_warning(first, now, self.threads, self.fix))


def collapse_warning(first_s: float, now_s: float, threads: int | None, fix: str) -> str:
    """What a run says when its forward passes take `now_s` seconds against `first_s` at its start."""
    head = (
        f"forward passes now take {now_s / first_s:.0f}x as long as this run's first ones ({now_s:.3g} s "
        f"against {first_s:.3g} s): other work is likely using the CPUs"
    )
    if threads is None or threads > 1:
        pool = f"torch's {threads} threads" if threads else "torch's threads"
        return f"{head}, and {pool} here wait for each other at every op when fewer CPUs are free; {fix}"
    return f"{head} (torch runs 1 thread here: fewer threads will not help; the machine needs free CPUs)"


class _Bar(tqdm):
    """tqdm's bar with the count as the log line writes it (tqdm prints a float count with all its digits)
    and the log line's rate and ETA (`pace`) in place of tqdm's own, which would count start-up in."""

    FORMAT = "{l_bar}{bar}| {count}/{total_fmt} [{elapsed}{pace}{postfix}]"

    def __init__(self, pace: Callable[[], str], **kwargs) -> None:
        self.pace = pace
        super().__init__(**kwargs)

    @property
    def format_dict(self) -> dict:
        pace = self.pace()
        return {**super().format_dict, "count": count(self.n), "pace": f", {pace}" if pace else ""}


class Progress:
    """Rows done out of `total`: shards written (`finished`) plus the reported part of those in flight
    (`partial`). The count shown never goes back (a shard scored again after its actor died starts over)."""

    def __init__(
        self, total: int, what: str = "rows", every_s: float = EVERY_S, bar: bool | None = None, waiting: str = WAITING
    ) -> None:
        self.total = total
        self.waiting = waiting
        self.what = what
        self.every_s = every_s
        self.shown = 0.0
        self.finished_rows = 0
        self._in_flight: dict[str, float] = {}
        self._finished: set[str] = set()
        self.started = self.last_log = time.monotonic()
        self.moves = 0  # how many times the count has moved
        self.warm: tuple[float, float] | None = None  # (when, rows shown) at the WARM_PASSES-th move
        self.warned = False
        show_bar = sys.stderr.isatty() if bar is None else bar
        self.bar = (
            _Bar(self.pace, total=total, unit=what, dynamic_ncols=True, postfix=waiting, bar_format=_Bar.FORMAT)
            if show_bar
            else None
        )

    def report(self, key: str, rows: int) -> Report:
        """The `Report` of shard `key` of `rows` rows, for a stage scoring it in this process."""
        return lambda done, total: self.partial(key, rows_done(rows, done, total))

    def partial(self, key: str, rows: float) -> None:
        """Shard `key` is `rows` rows along (ignored once the shard is finished)."""
        if key not in self._finished:
            self._in_flight[key] = rows
            self._show()

    def finished(self, key: str, rows: int) -> None:
        """Shard `key`'s file is written: its `rows` rows count in full."""
        self._finished.add(key)
        self._in_flight.pop(key, None)
        self.finished_rows += rows
        self._show()

    def warn(self, message: str) -> None:
        """Says `message` (a `Pace`'s) once in this run's display: the same news from another actor is not
        repeated."""
        if not self.warned:
            self.warned = True
            logger.warning("%s", message)

    def tick(self) -> None:
        """Logs a line if one is due, also when nothing moved (the run is alive, its ETA grows)."""
        self._show()

    def _show(self) -> None:
        value = min(self.total, max(self.shown, self.finished_rows + sum(self._in_flight.values())))
        moved, self.shown = value - self.shown, value
        if moved:
            self.moves += 1
            if self.moves == WARM_PASSES:
                self.warm = (time.monotonic(), value)
            if self.moves == 1 and self.bar is not None:
                self.bar.set_postfix_str("", refresh=False)
        if self.bar is not None:
            if moved:
                self.bar.update(moved)
            return
        now = time.monotonic()
        if now - self.last_log >= self.every_s or (moved and value == self.total):
            self.last_log = now
            logger.info("%s", self.line())

    def line(self) -> str:
        """`1,200/3,000 rows (40%), 120 rows/s, ETA 00:15` (three significant digits of the rate); before
        the first forward pass, `0/3,000 rows (0%), waiting for the first forward pass for 00:40`; until
        the rate is known, `12/3,000 rows (0%), ETA after warm-up`; at the end, `3,000/3,000 rows (100%),
        120 rows/s in 00:25`."""
        elapsed = time.monotonic() - self.started
        percent = int(100 * self.shown // self.total) if self.total else 100
        head = f"{count(self.shown)}/{self.total:,} {self.what} ({percent}%), "
        if self.moves == 0 and self.total:
            return head + f"{self.waiting} for {tqdm.format_interval(elapsed)}"
        if self.shown < self.total:
            return head + self.pace()
        rate = self.rate() or self.shown / max(elapsed, 1e-9)  # a run over before its rate was known: all of it
        return head + f"{rate:.3g} {self.what}/s in {tqdm.format_interval(elapsed)}"

    def pace(self) -> str:
        """`120 rows/s, ETA 00:15`, or `ETA after warm-up` until the rate is known; nothing before the first
        rows are done (the display says what it waits for) or once all are."""
        if self.moves == 0 or self.shown >= self.total:
            return ""
        rate = self.rate()
        if rate is None:
            return WARMING
        return f"{rate:.3g} {self.what}/s, ETA {tqdm.format_interval((self.total - self.shown) / rate)}"

    def rate(self) -> float | None:
        """Rows per second since the display's WARM_PASSES-th move, once that spans RATE_MIN_S seconds and
        more rows; None before. Start-up (loading models, starting actors) and the first, slower forward
        passes are left out, so that the ETA follows the run's own pace."""
        if self.warm is None:
            return None
        since, rows = time.monotonic() - self.warm[0], self.shown - self.warm[1]
        return rows / since if since >= RATE_MIN_S and rows > 0 else None

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
