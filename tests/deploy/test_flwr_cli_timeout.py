"""deploy.flwr_cli.flwr: a timed-out `flwr` call names what it printed, as text."""

from __future__ import annotations

import sys

import pytest

from deploy import flwr_cli


def test_a_timeout_reports_the_output_as_text(tmp_path, monkeypatch):
    script = tmp_path / "fake-flwr"
    script.write_text(f"#!{sys.executable}\nimport sys, time\nprint('half-way there', flush=True)\n"
                      "print('still waiting', file=sys.stderr, flush=True)\ntime.sleep(30)\n")
    script.chmod(0o755)
    monkeypatch.setattr(flwr_cli, "executable", lambda name: str(script))
    with pytest.raises(flwr_cli.FlwrCliError) as err:
        flwr_cli.flwr(["ls"], tmp_path / "home", timeout=2)
    msg = str(err.value)
    assert "timed out after 2s" in msg and "half-way there" in msg
    assert "b'" not in msg
