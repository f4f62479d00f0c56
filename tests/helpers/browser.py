"""Headless Chromium for the pages the product writes (report.html, trend.html): a DOM dump or a screenshot."""

from __future__ import annotations

import subprocess
import tempfile


def chromium(*args: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    return done.stdout
