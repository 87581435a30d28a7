"""Issue 41, item 8: a `ray start` cluster on the machine must not capture (and crash) a plain simulation.

A real ``ray start --head --block`` without ``--temp-dir`` (so it writes ``ray_current_cluster`` where a
bare ``ray.init()`` looks: ``$RAY_TMPDIR/ray``, a private RAY_TMPDIR here instead of /tmp), its own ports,
stopped by PID. Before the fix the in-process runner attached to it, Ray refused ``num_cpus`` and the run
hung with a partial folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from deploy import flwr_cli
from deploy.processes import ProcessSet, free_port, start
from deploy.ray_cluster import READY, node_ports

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def machine_cluster(tmp_path):
    tmpdir = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's Unix sockets live under it
    env = flwr_cli.flower_env(tmp_path / "flwr-home", {"RAY_TMPDIR": str(tmpdir), "RAY_USAGE_STATS_ENABLED": "0"})
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    procs = ProcessSet()
    head = procs.add(start("ray-head", [flwr_cli.executable("ray"), "start", "--head", "--node-ip-address", "127.0.0.1",
                                        "--port", str(port), "--include-dashboard", "false", "--num-cpus", "1",
                                        "--object-store-memory", str(100 * 1024 * 1024), "--disable-usage-stats",
                                        *node_ports(head=True), "--block"], tmp_path / "head.log", env=env))
    try:
        deadline = time.monotonic() + 180
        while READY not in head.log_text():
            assert head.alive(), head.tail()
            assert time.monotonic() < deadline, head.tail()
            time.sleep(0.5)
        assert (tmpdir / "ray" / "ray_current_cluster").read_text().strip().endswith(f":{port}")
        yield tmpdir, (tmpdir / "ray" / "session_latest").resolve()  # the head's session (a later Ray moves the link)
    finally:
        procs.stop_all(grace=15.0)
        subprocess.run(["rm", "-rf", str(tmpdir)], check=False)


def test_an_in_process_run_ignores_a_cluster_it_was_not_given(machine_cluster, tmp_path):
    tmpdir, session = machine_cluster
    import flower_apps.engine as engine

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    os.environ.pop("RAY_ADDRESS", None)
    assert engine.backend_config()["init_args"]["address"] == "local"
    results = tmp_path / "results"
    code = ("from flower_apps.runner import run_config_in_process as r; "
            f"r({{'study': 'dfl-dp', 'preset': 'smoke', 'num-rounds': 1, 'results-dir': {str(results)!r}}})")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "RAY_TMPDIR": str(tmpdir)},
                         capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "num_cpus and num_gpus must not be provided" not in out
    (summary,) = results.rglob("summary.json")
    # the run did not attach to the machine's cluster: no driver in that cluster's session, another session
    logs = session / "logs"
    assert not list(logs.glob("python-core-driver-*")), sorted(p.name for p in logs.iterdir())
    assert any((tmpdir / "ray").glob("session_2*/logs/python-core-driver-*")), "the run's own private Ray"
