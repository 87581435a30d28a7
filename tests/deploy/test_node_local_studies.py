"""unlinkable-dfl and ultrasound with node-local data, in process: the real ServerApp and ClientApp logic.

``deploy.export`` writes the simulated partition into one folder per node; a fake grid
(tests/conftest.py) delivers every message to the real root ClientApp (``flower_apps.router``: each
message type to the study's handler) with the node's
``data-path`` in its node config, as a SuperNode started with ``--node-config`` would. Checked:
the deployed run ends with the same models as the simulation of the same seed (the loopback run
with real SuperNodes is in test_node_local_federation.py, slow), a node whose folder is malformed
is named in summary.json and the others train on, and the coordinator refuses a missing eval set.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from datasets.base import DataError
from deploy.export import export
from flower_apps.router import client_app, prepare

UDFL = {"num-clients": 6, "num-rounds": 2}
# Idle 2-core machine: each test here takes 5-7 s.
# Smallest ultrasound run with every phase: 3 clients, one round, one local epoch (BUSI or synthetic).
US = {"num-clients": 3, "num-rounds": 1, "us-pretrained": False}


def _grid(fake_grid_cls, handler, paths: dict[int, object]):
    def handle(node_id, msg):
        cfg = {"data-path": str(paths[node_id])} if node_id in paths else {}
        return handler(msg, Context(1, node_id, {**cfg, "node-name": f"site-{node_id}"}, RecordDict(), {}))
    return fake_grid_cls(sorted(paths) or [1, 2], handle)


def _run(study: str, server_main, grid, overrides: dict, out) -> dict:
    _, cfg = prepare({"study": study, "preset": "smoke", "seed": 0, **overrides, "results-dir": str(out)})
    summary = server_main(grid, cfg)
    (folder,) = {p.parent for p in out.rglob("summary.json")}
    return {"summary": summary, "dir": folder}


def _bad_images_node(root, study: str) -> None:
    (root / study).mkdir(parents=True)
    (root / study / "client-0.npz").write_bytes(b"not a zip")
    (root / study / "node.json").write_text(json.dumps(
        {"format": "images-npz", "node": "node-2", "clients": {"0": "client-0.npz"}, "num_classes": 10,
         "mean": [0.1307], "std": [0.3081]}))


def test_unlinkable_dfl_node_local_equals_the_simulation_and_names_the_bad_node(tmp_path, fake_grid_cls):
    from flower_apps.unlinkable_dfl.server_app import server_main

    rec = export("unlinkable-dfl", 2, 0, tmp_path / "data", "smoke", UDFL)
    assert [n["client_ids"] for n in rec["nodes"].values()] == [[0, 1, 2], [3, 4, 5]]
    _bad_images_node(tmp_path / "data" / "node-2", "unlinkable-dfl")
    paths = {1: tmp_path / "data" / "node-0", 2: tmp_path / "data" / "node-1", 3: tmp_path / "data" / "node-2"}
    dep = _run("unlinkable-dfl", server_main, _grid(fake_grid_cls, client_app, paths),
               {**rec["run_config"], **UDFL}, tmp_path / "deployed")
    sim = _run("unlinkable-dfl", server_main, _grid(fake_grid_cls, client_app, {}), UDFL, tmp_path / "sim")
    s = dep["summary"]
    assert s["node_local_data"] and s["missing_clients"] == [] and s["round_errors"] == []
    assert {n["node"]: n["client_ids"] for n in s["nodes"]} == {"site-1": [0, 1, 2], "site-2": [3, 4, 5]}  # node-names
    (err,) = s["node_errors"]
    # the SuperNode's node-name, then the manifest's node name, the file and the problem
    assert err["node_id"] == 3 and err["error"].startswith("site-3: ") and "node-2" in err["error"]
    assert "client-0.npz: not a readable .npz" in err["error"]
    # Same learning: every node's accuracy (now computed by the coordinator on the exported test prefix).
    assert s["acc_curve"] == pytest.approx(sim["summary"]["acc_curve"], abs=1e-9)
    dep_rows = [json.loads(r) for r in (dep["dir"] / "rounds.jsonl").read_text().splitlines()]
    sim_rows = [json.loads(r) for r in (sim["dir"] / "rounds.jsonl").read_text().splitlines()]
    for a, b in zip(dep_rows, sim_rows, strict=True):
        for k in ("test_acc_min", "test_acc_max", "test_loss", "train_loss", "completeness", "coverage"):
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), k


def test_unlinkable_dfl_a_failed_node_sits_out_and_the_summary_says_why(tmp_path, fake_grid_cls):
    from flower_apps.unlinkable_dfl.server_app import server_main

    rec = export("unlinkable-dfl", 3, 0, tmp_path / "data", "smoke", UDFL)
    shutil.rmtree(tmp_path / "data" / "node-2" / "unlinkable-dfl")  # node-2 has no data at all
    paths = {i + 1: tmp_path / "data" / f"node-{i}" for i in range(3)}
    dep = _run("unlinkable-dfl", server_main, _grid(fake_grid_cls, client_app, paths),
               {**rec["run_config"], **UDFL}, tmp_path / "deployed")
    s = dep["summary"]
    assert s["missing_clients"] == [4, 5] and s["node_errors"][0]["error"].startswith("site-3")
    assert "node.json: missing" in s["node_errors"][0]["error"]
    rows = [json.loads(r) for r in (dep["dir"] / "rounds.jsonl").read_text().splitlines()]
    assert [r["live_nodes"] for r in rows] == [4, 4] and np.isfinite(s["final_acc"])


def _bad_busi_node(root) -> None:
    (root / "ultrasound" / "client-0" / "benign").mkdir(parents=True)  # malignant/ and normal/ missing
    (root / "ultrasound" / "node.json").write_text(json.dumps(
        {"format": "busi-folder", "node": "node-2", "clients": {"0": "client-0"}}))


def test_ultrasound_node_local_equals_the_simulation_and_names_the_bad_node(tmp_path, fake_grid_cls):
    from flower_apps.ultrasound.server_app import server_main

    rec = export("ultrasound", 2, 0, tmp_path / "data", "smoke", US)
    coord = tmp_path / "data" / "coordinator" / "ultrasound"
    assert all((coord / part / c).is_dir() for part in ("test", "val") for c in ("benign", "malignant", "normal"))
    _bad_busi_node(tmp_path / "data" / "node-2")
    paths = {1: tmp_path / "data" / "node-0", 2: tmp_path / "data" / "node-1", 3: tmp_path / "data" / "node-2"}
    dep = _run("ultrasound", server_main, _grid(fake_grid_cls, client_app, paths), {**rec["run_config"], **US},
               tmp_path / "deployed")
    sim = _run("ultrasound", server_main, _grid(fake_grid_cls, client_app, {}), US, tmp_path / "sim")
    s = dep["summary"]
    (err,) = s["node_errors"]
    assert err["error"].startswith("site-3: ") and "node-2" in err["error"]
    assert "class folder(s) ['normal', 'malignant'] missing" in err["error"]
    assert s["missing_clients"] == [] and s["n_train"] == sim["summary"]["n_train"]
    assert s["n_test"] == sim["summary"]["n_test"] and s["n_val"] == sim["summary"]["n_val"]
    a = torch.load(dep["dir"] / "final_model.pt", weights_only=True)
    b = torch.load(sim["dir"] / "final_model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    assert s["acc_curve"] == pytest.approx(sim["summary"]["acc_curve"], abs=1e-9)
    assert [r["n_val"] for r in s["per_client"]] == [r["n_val"] for r in sim["summary"]["per_client"]]


def test_ultrasound_coordinator_refuses_missing_eval_data(tmp_path):
    from flower_apps.ultrasound.data import validate_data

    _, cfg = prepare({"study": "ultrasound", "preset": "smoke", **US, "node-local-data": True})
    with pytest.raises(DataError, match="node-local-data=true needs eval-data-path"):
        validate_data(cfg)
    _, cfg = prepare({"study": "ultrasound", "preset": "smoke", **US, "node-local-data": True,
                      "eval-data-path": str(tmp_path / "nowhere")})
    with pytest.raises(DataError, match="nowhere: not a folder"):
        validate_data(cfg)
    (tmp_path / "coord" / "test").mkdir(parents=True)
    _, cfg = prepare({"study": "ultrasound", "preset": "smoke", **US, "node-local-data": True,
                      "eval-data-path": str(tmp_path / "coord")})
    with pytest.raises(DataError, match=r"coord/test: class folder\(s\) \['normal', 'benign', 'malignant'\] missing"):
        validate_data(cfg)


def test_busi_reader_keeps_the_exported_order_and_allows_an_empty_class(tmp_path):
    from datasets.node_local import read_busi_folder, write_busi_folder

    imgs = [np.full((5, 7), v, np.uint8) for v in (10, 20, 30, 40)]
    labels = np.array([1, 0, 1, 0])  # into ("normal", "benign", "malignant"): malignant/ stays empty
    write_busi_folder(tmp_path / "c", imgs, labels, [2, 1, 0], ("normal", "benign", "malignant"))
    assert not any((tmp_path / "c" / "malignant").iterdir())
    got = read_busi_folder(tmp_path / "c")
    assert [int(i[0, 0]) for i in got.images] == [30, 20, 10]  # position order, not class order
    assert got.labels.tolist() == [1, 0, 1]  # benign, normal, benign
