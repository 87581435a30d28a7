"""Flower's simulation engine attached to an existing Ray cluster (head + one worker on loopback).

The cluster is started with ``ray start --block`` on free ports and a private temp dir, and is
stopped by PID (never ``ray stop``, which would stop other users' Ray). The dfl-dp smoke runs
through ``flwr run`` on a simulation SuperLink whose environment holds RAY_ADDRESS; the test
then checks, from the cluster's own logs, that the simulation's Ray driver attached to *this*
cluster and that ClientApp actors ran on both of its nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import flwr_cli
from deploy.processes import ProcessSet
from deploy.ray_cluster import CONNECTION, LocalRayCluster, start_simulation_superlink

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process-tree teardown reads /proc"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    c = LocalRayCluster(tmp_path_factory.mktemp("ray"), num_workers=1, cpus_per_node=1)
    request.addfinalizer(c.stop)
    try:
        c.start()
    except Exception as exc:
        pytest.fail(f"Ray cluster did not start: {exc}\n{c.procs.report()}")
    return c


def test_cluster_has_two_nodes(cluster):
    ids = cluster.node_ids()
    assert len(ids) == 2 and len(set(ids)) == 2, ids


def test_flwr_run_simulation_attaches_to_the_cluster(cluster, tmp_path, request):
    procs = ProcessSet()
    request.addfinalizer(procs.stop_all)
    results = tmp_path / "results"
    start_simulation_superlink(tmp_path, cluster.address, procs)
    cli = tmp_path / "cli"
    run_id = flwr_cli.start_run(REPO, CONNECTION, cli, {"study": "dfl-dp", "preset": "smoke",
                                                        "results-dir": str(results)},
                                federation_config={"num-supernodes": 2, "client-resources-num-cpus": 1})
    run_dir = results / "dfl-dp" / "runs" / "fl_C1_eps2_N10_T2_mnist-5k_s0"

    def report() -> str:
        log = flwr_cli.run_log(run_id, CONNECTION, cli)
        return f"{procs.report()}\n{cluster.procs.report(20)}\n----- flwr log -----\n{log[-6000:]}"

    try:
        info = flwr_cli.wait_run(run_id, CONNECTION, cli, timeout=480, done=(run_dir / "summary.json").is_file)
    except TimeoutError as exc:
        pytest.fail(f"{exc}\n{report()}")
    assert info["status"] == "finished:completed", f"{info}\n{report()}"

    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert summary["num_rounds"] == 2 and [r["round"] for r in rounds] == [1, 2]
    assert all(r["num_contributors"] == 10 and r["num_failed"] == 0 for r in rounds), \
        f"{rounds}\nround_errors: {summary.get('round_errors')}\n{report()}"

    # The simulation's Ray driver attached to this cluster (its core-driver log is in the
    # cluster's session dir) rather than starting a private local Ray ...
    assert cluster.driver_pids(), f"no Ray driver attached to {cluster.address}\n{report()}"
    # ... and Ray placed the ClientApp actors (1 CPU each, 1 CPU per node) on both nodes.
    assert cluster.job_worker_nodes() == set(cluster.node_ids()), \
        f"actors on {cluster.job_worker_nodes()}, nodes {cluster.node_ids()}\n{report()}"

    # deploy.ray_placement reads the same placement from the GCS (no dashboard needed) ...
    from deploy.ray_placement import placement

    jobs = [j for j in placement(cluster.address)["jobs"] if j["driver_pid"] in cluster.driver_pids()]
    assert jobs and set().union(*(j["actors_per_node"] for j in jobs)) == set(cluster.node_ids()), jobs


def test_an_in_process_run_on_the_cluster_prints_actor_output_but_no_metrics_agent_notices(cluster, tmp_path):
    """The cluster's GCS and raylets each log "Failed to establish connection to the ... metrics exporter
    agent" (no agent without ray[default]) and Ray forwards those lines to every driver; the in-process
    engine hides exactly them (flower_apps.common.ray_notices), actor output still comes through."""
    code = ("from deploy.ray_cluster import simulate_on_cluster; "
            f"simulate_on_cluster({cluster.address!r}, {{'study': 'dfl-dp', 'preset': 'smoke', 'num-rounds': 1, "
            f"'results-dir': {str(tmp_path / 'results')!r}}})")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-4000:]
    assert "(ClientAppActor pid=" in console, console[-4000:]  # forwarded actor output reached the console
    assert "exporter agent" in "".join(f.read_text(errors="replace") for f in cluster.logs_dir().glob("*.err"))
    assert "exporter agent" not in console.replace("metrics-exporter notices hidden", ""), console[-4000:]
