"""Ray's own messages go to the run log, not the terminal; everything else still reaches the terminal."""

from __future__ import annotations

import logging
import os
import warnings

import pytest

from distributed_scoring.pipeline.ray_log import RunLog, ray_output_to, split_core_lines

CORE = (
    b"[2026-11-24 22:44:27,107 E 10320 10589] core_worker.cc:2465: Actor with class name: 'MapWorker("
    b"MapBatches(PrepareStage))' has constructor arguments in the object store and max_restarts > 0.\n"
)
ABSL = b"E1124 22:44:27.107000   10320 chttp2_transport.cc:1234] ping timed out\n"
OURS = b"2026-11-24 22:44:26,427 INFO distributed_scoring.pipeline.on_ray: running 3 shards of pll on Ray\n"
BAR = b"\r 40%|####      | 400/1000 [00:10<00:15, 40.0rows/s]\r 50%|#####     | 500/1000 [00:12<00:12, 40.0rows/s]"
EXIT = b"Error: something the user must see\n"


def route(stream: bytes, cuts: list[int]) -> tuple[bytes, bytes]:
    """(to the terminal, to the log) of `stream` fed to the router in chunks cut at `cuts`."""
    terminal, log, deciding, to_log = b"", b"", b"", None
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        routed, deciding, to_log = split_core_lines(stream[start:end], deciding, to_log)
        for logged, data in routed:
            if logged:
                log += data
            else:
                terminal += data
    return terminal + deciding, log


@pytest.mark.parametrize("cuts", [[], [1], [5, 30, 31, 200], list(range(1, 800, 7)), list(range(1, 800))])
def test_core_lines_are_told_apart_wherever_the_reads_cut_them(cuts):
    """Also a core line written right after a progress bar's text, which has no line end until the bar closes."""
    stream = OURS + CORE + BAR + CORE + BAR + b"\n" + ABSL + EXIT + CORE
    terminal, log = route(stream, cuts)
    assert log == CORE + CORE + ABSL + CORE
    assert terminal == OURS + BAR + BAR + b"\n" + EXIT


# A raylet notice whose message is a remote traceback, over many lines (an actor's creation error): before,
# only its first line went to the run log and the other 100 reached the terminal.
NOTICE = (
    b"\x1b[33m(raylet)\x1b[0m Task MapWorker(MapBatches(ScoreStage)).get_location failed. Error: Traceback (most "
    b'recent call last):\n\n  File "python/ray/_raylet.pyx", line 2198, in ray._raylet.execute_task\n\n'
    b"During handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n"
    b"    raise ModelLoadError(\ndistributed_scoring.engine.model_files.ModelLoadError: 'x' has no trained head\n\n"
)


@pytest.mark.parametrize("cuts", [[], [3, 90, 91, 300], list(range(1, 900, 5))])
def test_the_lines_that_continue_a_message_of_rays_go_with_it(cuts):
    stream = OURS + NOTICE + OURS + CORE + EXIT + BAR + b"\n"
    terminal, log = route(stream, cuts)
    assert log == NOTICE + CORE
    assert terminal == OURS + OURS + EXIT + BAR + b"\n"


def test_ray_output_goes_to_the_run_log_and_the_rest_to_the_terminal(tmp_path, capfd, caplog):
    caplog.set_level(logging.INFO)
    log = RunLog()
    with ray_output_to(log):
        during = {name: list(logging.getLogger(name).handlers) for name in ("ray", "ray.data")}
        logging.getLogger("ray").warning("Token authentication is enabled for this Ray cluster.")
        os.write(2, CORE)  # as Ray's C++ core writes it, past Python
        log.open(str(tmp_path / "dscore-driver.log"))  # Ray's session folder exists only from here on
        logging.getLogger("ray.data").info("Execution plan of Dataset dataset_1")
        logging.getLogger("distributed_scoring.pipeline.on_ray").info("running 3 shards of pll on Ray")
        os.write(2, EXIT)
    assert capfd.readouterr().err == EXIT.decode()
    written = (tmp_path / "dscore-driver.log").read_text()
    for line in ("Token authentication", CORE.decode(), "Execution plan", "running 3 shards"):
        assert line in written
    assert "Token authentication" not in caplog.text and "running 3 shards" in caplog.text
    os.write(2, b"after\n")  # file descriptor 2 and Ray's loggers are as they were
    assert capfd.readouterr().err == "after\n"
    for name, inside in during.items():
        after = logging.getLogger(name).handlers
        assert not any(isinstance(h, logging.StreamHandler) for h in inside)  # Ray's console handler set aside,
        assert any(isinstance(h, logging.StreamHandler) for h in after)  # and back
        assert [type(h).__name__ for h in inside if h not in after] == ["_ToRunLog"]


def test_a_progress_bar_is_passed_on_at_once():
    """A bar redraws without line ends; only what may still turn out to be a core line is held back."""
    routed, held, _ = split_core_lines(BAR, b"", None)
    assert held == b"" and b"".join(data for _, data in routed) == BAR and not any(logged for logged, _ in routed)
    routed, held, _ = split_core_lines(BAR + b"[2026-11", b"", None)
    assert held == b"[2026-11" and b"".join(data for _, data in routed) == BAR


def test_what_ray_said_before_failing_to_start_reaches_the_terminal(capfd):
    """No session folder, no run log: the lines held for it are shown when the run ends."""
    with pytest.raises(ConnectionError):
        with ray_output_to(RunLog()):
            logging.getLogger("ray").error("Could not connect to the GCS at 10.0.0.1:6379")
            os.write(2, CORE)
            raise ConnectionError("ray.init failed")
    err = capfd.readouterr().err
    assert "Could not connect to the GCS" in err and CORE.decode() in err


def test_rays_python_warnings_go_to_the_run_log_and_others_are_shown(tmp_path):
    """Ray Data's advice on an actor pool with fewer inputs than actors is a UserWarning raised in Ray's code."""
    from ray.data._internal.execution.operators import actor_pool_map_operator

    advice = (
        "The minimum number of concurrent actors for 'MapBatches(ScoreStage)' is set to 2, but the operator "
        "only received 1 input(s)."
    )
    log = RunLog()
    with pytest.warns(UserWarning) as shown:
        shown_before = warnings.showwarning
        with ray_output_to(log):
            log.open(str(tmp_path / "dscore-driver.log"))
            warnings.warn_explicit(advice, UserWarning, actor_pool_map_operator.__file__, 552)
            warnings.warn_explicit("a warning of our own", UserWarning, __file__, 1)
        assert warnings.showwarning is shown_before
    assert [str(w.message) for w in shown] == ["a warning of our own"]
    assert advice in (tmp_path / "dscore-driver.log").read_text()
