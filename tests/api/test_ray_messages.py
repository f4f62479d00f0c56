"""`ray_messages_to_file`: Ray's own messages in the user's own pipeline go to a log file it names, not to the
terminal (the PLLStage example printed some thirty lines of Ray's); this package's records still show."""

from __future__ import annotations

import logging
import os
import warnings

import pytest

from distributed_scoring.api.ray_messages import ray_messages_to_file


@pytest.mark.ray
def test_ray_s_messages_go_to_the_file_it_names(ray_local, capfd, caplog):
    """With Ray already up (as here, the session's), it is used as it is; the log is in its session folder."""
    with caplog.at_level(logging.INFO, logger="distributed_scoring"):
        with ray_messages_to_file() as path:
            logging.getLogger("ray.data").info("Execution plan of Dataset dataset_1: InputDataBuffer -> Write")
            logging.getLogger("distributed_scoring.api").info("this package's own line")
            import ray.data

            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.warn_explicit("Use 'expr' instead of 'fn'", UserWarning, ray.data.__file__, 1)
    err = capfd.readouterr().err
    assert os.path.basename(path) == f"dscore-driver-{os.getpid()}.log" and os.path.dirname(path).endswith("logs")
    kept = open(path).read()
    assert "Execution plan of Dataset dataset_1" in kept and "Use 'expr' instead of 'fn'" in kept
    assert "Execution plan" not in err and "Use 'expr'" not in err
    assert "this package's own line" in caplog.text
