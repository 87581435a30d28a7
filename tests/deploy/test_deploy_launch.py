"""What a user of ``flwr run`` sees for bad input: one line naming the key, before Flower is asked."""

from __future__ import annotations

import logging

import pytest

from datasets.base import DataError
from deploy import launch
from flower_apps.config import ConfigError
from flower_apps.router import OneLineRefusals


@pytest.mark.parametrize("run_config,expected", [
    ("study='dfl-dp' eps-call=2.0", "'eps-call' (did you mean 'eps-cal'?)"),
    ("study='dfl-dp' eps-cal=inf", "eps-cal must be a finite number, got inf"),
    ("study='dfl-dp' clip-norm=nan", "clip-norm must be a finite number, got nan"),
    ("study='tabular-pdp' tab-noise-multiplier=-1.0", "tab-noise-multiplier: must be >= 0"),
    ("study='dfl-dp' round-timeout=-5.0", "round-timeout must be > 0"),
    ("study='ultrasound' seed=-1", "seed must be an integer >= 0"),
])
def test_launch_refuses_bad_config_before_flower_with_one_line(run_config, expected, capsys, monkeypatch):
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: pytest.fail("flwr run was started"))
    assert launch.main([".", "--run-config", run_config]) == launch.EXIT_REFUSED
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err and "Traceback" not in err


def test_launch_passes_a_valid_config_to_flwr_and_reports_the_run_status(capsys, monkeypatch):
    calls = []

    class FakeRun:
        def __init__(self, cmd, **kwargs):
            calls.append(cmd)
            self.stdout = iter(["Successfully started run 42\n", "INFO : round 1\n"])
            self.returncode = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(launch.subprocess, "Popen", FakeRun)
    for status, code in [("finished:failed", launch.EXIT_RUN_FAILED), ("finished:completed", 0)]:
        monkeypatch.setattr(launch, "run_status", lambda run_id, superlink, s=status: {"status": s})
        assert launch.main([".", "--run-config", "study='dfl-dp' preset='smoke'"]) == code
        assert f"run 42: {status}" in capsys.readouterr().err
    assert calls[0][1:3] == ["run", "."] and "--stream" in calls[0]


@pytest.mark.parametrize("exc,refused", [(ConfigError("eps-cal: must be > 0"), True),
                                         (DataError("data-dir '/x' does not exist"), True),
                                         (RuntimeError("boom"), False)])
def test_refusals_are_logged_as_one_line_other_errors_keep_their_traceback(exc, refused):
    try:
        raise exc
    except Exception as caught:  # what Flower's run_serverapp does
        record = logging.LogRecord("flwr", logging.ERROR, __file__, 1, "%s raised an exception", ("ServerApp",),
                                   (type(caught), caught, caught.__traceback__))
    assert OneLineRefusals().filter(record)
    text = logging.Formatter().format(record)
    if refused:
        assert text == f"run refused before any work: {exc}"
    else:
        assert "Traceback" in text and "boom" in text
