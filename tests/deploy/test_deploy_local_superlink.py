"""deploy.local_superlink: the port flwr's local SuperLink uses, and stopping only this user's SuperLink on it.

A real ``flower-superlink`` (loopback, free port, private FLWR_HOME) is started and stopped; a listener
that is not a SuperLink, and a SuperLink on another port, are left alone.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import pytest

from deploy import flwr_cli
from deploy.local_superlink import DEFAULT_PORT, PORT_ENV, local_port, main, superlinks_on
from deploy.processes import ProcessSet, free_port, is_alive, start


def _flwr_port(env_port: str | None) -> str:
    """LOCAL_SUPERLINK_HTTP_API_PORT as flwr itself computes it in a fresh process."""
    env = {k: v for k, v in flwr_cli.flower_env("/nonexistent").items() if k != PORT_ENV}
    if env_port is not None:
        env[PORT_ENV] = env_port
    code = "from flwr.cli.constant import LOCAL_SUPERLINK_HTTP_API_PORT as p; print(p)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=True).stdout.strip()


def test_port_is_read_as_flwr_reads_it():
    assert str(local_port({})) == _flwr_port(None) == str(DEFAULT_PORT)
    assert str(local_port({PORT_ENV: "41234"})) == _flwr_port("41234") == "41234"
    with pytest.raises(ValueError, match=PORT_ENV):
        local_port({PORT_ENV: "not-a-port"})


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).is_success
    except httpx.HTTPError:
        return False


def test_stop_signals_only_this_users_superlink_on_that_port(tmp_path, capsys):
    procs = ProcessSet()
    try:
        links = {}
        for name in ("mine", "other"):
            port = free_port()
            env = flwr_cli.flower_env(tmp_path / name / ".flwr", {"HOME": str(tmp_path / name)})
            links[name] = (port, procs.add(start(name, [
                flwr_cli.executable("flower-superlink"), "--insecure", "--simulation",
                "--host", "127.0.0.1", "--port", str(port)], tmp_path / f"{name}.log", env=env)))
        deadline = time.monotonic() + 120
        while not all(_healthy(port) for port, _ in links.values()):
            assert all(m.alive() for _, m in links.values()), procs.report()
            assert time.monotonic() < deadline, procs.report()
            time.sleep(0.5)
        # A listener that is not a flower-superlink (this pytest process) is never a target.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            assert superlinks_on(s.getsockname()[1]) == []
        port, mine = links["mine"]
        assert [p for p, _ in superlinks_on(port)] == [mine.pid]
        assert main(["stop", "--port", str(port)]) == 0
        assert f"pid {mine.pid}" in capsys.readouterr().out
        mine.popen.wait(timeout=30)
        assert not _healthy(port)
        other_port, other = links["other"]
        assert other.alive() and is_alive(other.proc) and _healthy(other_port)  # the other SuperLink runs on
        assert main(["stop", "--port", str(port)]) == 1  # nothing of ours left there
        assert "no flower-superlink of yours" in capsys.readouterr().err
    finally:
        procs.stop_all()
