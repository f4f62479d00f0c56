"""`dscore history HIST`: the nightly audits' series, as a table and a trend page; earlier audits added."""

from __future__ import annotations

import argparse

from .common import Command, add_options, finish, options_from

COMMAND = Command(
    "history",
    "the series of nightly audits (dscore audit --history): a table, trend.html, earlier audits added",
    description="Reads the history HIST (a folder or URI written by `dscore audit --history`), prints the corpus "
    "per night with each rule's verdict, and writes a self-contained trend.html (PPPL, error rate and tail share "
    "per scope, flagged nights and segments marked). --add adds earlier audits' folders as nights first. Exit "
    "codes: 0 a readable history, 2 none or bad input.",
    place=72,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.audit.series import SeriesRules

    p.add_argument("history", metavar="HIST", help="the history folder or URI (dscore audit --history)")
    p.add_argument(
        "--add",
        nargs="+",
        default=(),
        metavar="AUDIT_DIR",
        help="earlier audits' folders (each holding audit.json) to add as nights, labelled by the UTC date each ran",
    )
    p.add_argument(
        "--trend",
        default="trend.html",
        metavar="PATH",
        help="where to write the trend page (default %(default)s; a local path)",
    )
    p.add_argument(
        "--last", type=int, default=30, metavar="N", help="nights shown on the terminal (default %(default)s)"
    )
    add_options(p, SeriesRules, ["window", "min_nights", "max_tail_increase", "canary_tolerance"])


def run(args: argparse.Namespace) -> int:
    from ..workflows.audit.history_view import show_history
    from ..workflows.audit.series import SeriesRules

    view = show_history(args.history, tuple(args.add), args.trend, options_from(args, SeriesRules))
    lines = [*(f"added {line}" for line in view.added), view.table(max(args.last, 1)), f"trend page: {view.trend_path}"]
    return finish(args, "\n".join(lines))
