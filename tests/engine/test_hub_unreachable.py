"""A Hub id where the Hub cannot be reached (model_files.local_files_only): one line naming the ways out
within 5 s when the model is nowhere on this machine, and a model in the local Hub cache loads from it
without a wait. Left to huggingface_hub, the first took 27 s of retries and doubled warnings, the second
7 minutes (every file asked for five times).

The commands run as a user runs them, in a process of their own with the Hub switched on (the suite's
HF_HUB_OFFLINE removed) and pointed at an endpoint on loopback that refuses connections, or that takes them
and never answers, the slowest way a Hub can be out of reach; their Hub cache is a folder of the test's own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.model_files import OFFLINE_MODELS, load_error
from distributed_scoring.offline.models import MODELS

from helpers import tiny
from helpers.cli import refusal

DSCORE = [sys.executable, "-m", "distributed_scoring.cli"]
FAIL_WITHIN_S = 5.0


@pytest.fixture
def silent_endpoint():
    """An endpoint that accepts connections (the kernel completes them into the backlog) and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def refusing_endpoint():
    """An endpoint whose port is bound but not listening: every connection is refused at once."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{holder.getsockname()[1]}"


def hub_env(tmp_path: Path, endpoint: str | None, offline: bool = False) -> dict:
    """The environment of a user whose Hub is at `endpoint` (or switched off), with an empty Hub cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT")}
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def score(tmp_path: Path, model: str, env: dict, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    (tmp_path / "my.txt").write_text("The cat sat on the mat.\n")
    began = time.monotonic()
    done = subprocess.run(
        [*DSCORE, "score", "my.txt", "--model", model, "--output", "out"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - began


@pytest.mark.parametrize("hub", ["silent", "refusing", "HF_HUB_OFFLINE"])
def test_a_hub_id_found_nowhere_fails_in_seconds_in_one_line(hub, request, tmp_path):
    endpoint = {"silent": "silent_endpoint", "refusing": "refusing_endpoint"}.get(hub)
    env = hub_env(tmp_path, endpoint and request.getfixturevalue(endpoint), offline=hub == "HF_HUB_OFFLINE")
    done, took = score(tmp_path, "bert-base-cased", env, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    line = lines[0]
    assert line.startswith("dscore: error: model 'bert-base-cased' is neither a local folder nor in this machine's")
    assert "the Hub cannot be reached" in line and "`dscore fetch-model NAME`" in line, line
    assert all(name in line for name in MODELS), line
    assert took <= FAIL_WITHIN_S, f"failed after {took:.1f} s, not within {FAIL_WITHIN_S} s: {line}"
    assert not (tmp_path / "out").exists()


def test_a_causal_hub_id_found_nowhere_fails_in_seconds_in_one_line(refusing_endpoint, tmp_path, tiny_model_dir):
    nbest = tmp_path / "n.jsonl"
    nbest.write_text('{"id": "u1", "hyps": [{"text": "the cat", "score": -1}], "ref": "the cat"}\n')
    began = time.monotonic()
    done = subprocess.run(
        [*DSCORE, "rescore", "--dev", str(nbest), "--test", str(nbest), "--model", str(tiny_model_dir("bert"))]
        + ["--causal-model", "gpt2", "--output", "out"],
        cwd=tmp_path,
        env=hub_env(tmp_path, refusing_endpoint),
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - began
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "`dscore fetch-model NAME`" in lines[0], done.stderr
    assert took <= FAIL_WITHIN_S, f"failed after {took:.1f} s: {lines[0]}"


def test_a_hub_id_in_the_local_cache_loads_from_it_while_the_hub_is_unreachable(refusing_endpoint, tmp_path):
    repo = tmp_path / "hub" / "models--someone--tiny-bert"
    tiny.save_tiny("bert", repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    done, took = score(tmp_path, "someone/tiny-bert", hub_env(tmp_path, refusing_endpoint), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Retrying" not in done.stderr and '"ok": 1' in done.stdout, done.stderr[-3000:]


def test_the_way_out_names_every_offline_model():
    assert sorted(OFFLINE_MODELS) == sorted(MODELS)


def test_a_load_error_ends_the_libraries_sentence_once():
    exc = OSError("see how to run the library in offline mode at 'https://huggingface.co/docs/offline-mode'.")
    message = str(load_error(ModelSpec("m"), "configuration", exc))
    assert "offline-mode'. Pass a local folder" in message and ".." not in message


@pytest.mark.parametrize("name", ["a/b/c", "bad name"])
def test_a_name_neither_folder_nor_hub_id_is_refused_as_such(name, capsys, tmp_path):
    (tmp_path / "my.txt").write_text("The cat sat on the mat.\n")
    line = refusal(capsys, ["score", str(tmp_path / "my.txt"), "--model", name, "--output", str(tmp_path / "out")])
    assert f"model {name!r} is neither a local folder nor a Hub id" in line, line
