"""Flower's Deployment Engine on loopback: a SuperLink with TLS and SuperNode authentication,
three authenticated SuperNodes, an unauthorized one, and the dfl-dp smoke run through
``flwr run`` while one SuperNode crashes mid-round.

One federation serves the module (starting it costs most of the time); every process is torn
down by PID with its whole tree by the fixture's finalizer, also when a test fails.
Runtime on the shared 2-core machine: ~3 min at load average 5, ~5-6 min at load 18-20. Each
train message starts a ClientApp process (torch import + data plan), and a crashed node is
noticed only when its heartbeat expires (up to 60 s in flwr 1.42).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time

import pytest

from deploy import certs, flwr_cli
from deploy.local_federation import CONNECTION, LocalFederation
from privacy.mechanisms import calibrate_sigma_abs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process-tree teardown reads /proc"),
]

RECEIVE_TRAIN = r"Receiving: train\.dfl_dp message"


@pytest.fixture(scope="module")
def federation(tmp_path_factory, request):
    fed = LocalFederation(tmp_path_factory.mktemp("federation"), num_supernodes=3, startup_timeout=180)
    request.addfinalizer(fed.stop)  # registered before start: a failed start is torn down too
    try:
        fed.start()
        # An institution whose key was never registered tries to join (checked below); it
        # starts now so that its rejection overlaps the rest of the module.
        key = certs.write_node_key(fed.workdir / "intruder", "intruder")
        fed.intruder = fed.start_supernode("intruder", key.private_key, {"partition-id": 99})
    except Exception as exc:  # show every log, then fail
        pytest.fail(f"federation did not start: {exc}\n{fed.report()}")
    return fed


def test_each_supernode_has_its_own_node_config(federation):
    ids = {h.node_id for h in federation.supernodes.values()}
    assert len(ids) == 3 and None not in ids
    status = federation.node_status()
    assert all(status[i] == "online" for i in ids), status
    parts = sorted(h.node_config["partition-id"] for h in federation.supernodes.values())
    assert parts == [0, 1, 2]
    for h in federation.supernodes.values():  # the flag really reached the process
        assert f"partition-id={h.node_config['partition-id']}" in " ".join(h.process.cmd)


def test_unregistered_supernode_key_is_rejected(federation):
    proc = federation.intruder
    try:
        proc.popen.wait(timeout=180)
    except Exception:
        pytest.fail(f"the unregistered SuperNode was not turned away within 180 s\n{proc.tail()}")
    assert proc.popen.returncode != 0, proc.tail()
    assert "Failed to activate SuperNode" in proc.log_text(), proc.tail()
    superlink = federation.procs.items[0]
    assert "No SuperNode found with the given public key" in superlink.log_text(), superlink.tail()
    assert len(federation.node_status()) == 3  # nothing got registered on the side


def test_authorized_list_registration_is_idempotent(federation):
    # What docker/compose.yaml's `register` service runs against a SuperLink that already
    # knows the keys (persistent database): no new node, no error.
    listed = (federation.workdir / "certs" / certs.AUTHORIZED_LIST).read_text().splitlines()
    one = federation.workdir / "one-key.pub"  # one line of the list: each key costs a CLI call
    one.write_text(listed[0] + "\n")
    ids = flwr_cli.register_list(one, CONNECTION, federation.cli_home, skip_registered=True)
    assert ids == {"supernode-1": None}
    with pytest.raises(flwr_cli.FlwrCliError, match=flwr_cli.ALREADY_REGISTERED):
        flwr_cli.register_supernode(federation.keys[0].public_key, CONNECTION, federation.cli_home)
    assert len(federation.node_status()) == 3


def test_smoke_run_survives_a_supernode_crash_mid_round(federation, tmp_path):
    results = tmp_path / "results"
    marks = {name: len(h.process.log_text()) for name, h in federation.supernodes.items()}
    run_id = federation.run({"study": "dfl-dp", "preset": "smoke", "results-dir": str(results)})
    report = lambda: federation.report(run_id)  # evaluated only on failure

    # Crash the first SuperNode that receives a round-1 train message, while it trains.
    deadline = time.monotonic() + 300
    next_status = time.monotonic() + 30
    victim = None
    while victim is None:
        for name, h in federation.supernodes.items():
            if re.search(RECEIVE_TRAIN, h.process.log_text()[marks[name]:]):
                victim = name
                break
        else:
            if time.monotonic() > deadline:
                pytest.fail(f"no SuperNode received a train message within 300 s\n{report()}")
            if time.monotonic() > next_status:  # a ServerApp that failed at start fails the test now
                info = flwr_cli.run_info(run_id, CONNECTION, federation.cli_home)
                if info["status"] in flwr_cli.TERMINAL:
                    pytest.fail(f"run ended before any train message: {info}\n{report()}")
                next_status = time.monotonic() + 30
            time.sleep(0.2)
    federation.crash_supernode(victim)
    crashed = federation.supernodes[victim]
    survivors = [h for n, h in federation.supernodes.items() if n != victim]
    after_crash = {h.name: len(h.process.log_text()) for h in survivors}

    run_dir = results / "dfl-dp" / "runs" / "fl_C1_eps2_N10_T2_mnist-5k_s0"
    try:
        info = federation.wait(run_id, timeout=480, done=(run_dir / "summary.json").is_file)
    except TimeoutError as exc:
        pytest.fail(f"{exc}\n{report()}")
    assert info["status"] == "finished:completed", f"{info}\n{report()}"
    assert (run_dir / "summary.json").is_file(), f"{sorted(results.rglob('*'))}\n{report()}"
    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2]

    # The crash is recorded in round 1: fewer contributors, the rest counted as failed.
    r1, r2 = rounds
    assert 0 < r1["num_contributors"] < 10, rounds
    assert r1["num_failed"] == 10 - r1["num_contributors"], rounds
    # Round 2 maps all ten logical clients onto the two survivors, which both got work.
    assert r2["num_contributors"] == 10 and r2["num_failed"] == 0, rounds
    for h in survivors:
        assert re.search(RECEIVE_TRAIN, h.process.log_text()[after_crash[h.name]:]), \
            f"{h.name} got no message after the crash\n{report()}"
    assert federation.node_status()[crashed.node_id] == "offline"

    # Never under-noised: sigma_abs is calibrated to the clients that actually contributed,
    # so a round with failures has *more* noise than the nominal (N = 10) value.
    nominal = summary["sigma_abs_nominal"]
    assert math.isclose(nominal, calibrate_sigma_abs(1.0, 10, 2.0, 1e-5), rel_tol=1e-12)
    for r in rounds:
        expected = calibrate_sigma_abs(1.0, r["num_contributors"], 2.0, 1e-5)
        assert math.isclose(r["sigma_abs"], expected, rel_tol=1e-9), (r, expected)
        assert r["sigma_abs"] >= nominal * (1 - 1e-12), (r, nominal)
    assert r1["sigma_abs"] > nominal


def test_launch_reports_refused_data_as_one_line_and_exits_nonzero(federation, tmp_path):
    """What a user of ``python -m deploy.launch`` sees when the data is unusable: the ServerApp
    refuses before any work (one line, no traceback, no run folder) and the command exits 1, where
    plain ``flwr run --stream`` would exit 0."""
    import subprocess

    results = tmp_path / "results"
    missing = tmp_path / "no-such-mnist"
    cmd = [sys.executable, "-m", "deploy.launch", str(federation.app_dir), CONNECTION, "--run-config",
           f"study='dfl-dp' preset='smoke' dataset='mnist-full' data-dir='{missing}' results-dir='{results}'"]
    res = subprocess.run(cmd, cwd=federation.app_dir, env=flwr_cli.flower_env(federation.cli_home),
                         capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert f"run refused before any work: data-dir '{missing}' does not exist" in out, out
    assert "Traceback" not in out, out
    assert "finished:failed" in res.stderr, out
    assert not results.exists()
