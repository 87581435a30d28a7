"""Node-local data folders: the export writes exactly the simulated partition, and the readers refuse
bad folders with one line naming the node, the file and the problem."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from datasets.node_local import (
    MANIFEST,
    NodeDataError,
    node_folder,
    read_eval_set,
    read_image_clients,
    read_manifest,
    read_table_clients,
    write_image_node,
    write_table_node,
)
from deploy.export import export, node_blocks
from flower_apps.router import prepare


def test_node_blocks_are_contiguous_whole_messages():
    assert node_blocks(10, 2, 5) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert node_blocks(10, 3, 1) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert node_blocks(7, 2, 3) == [[0, 1, 2, 3, 4, 5], [6]]  # a message never straddles two nodes
    with pytest.raises(ValueError, match="3 nodes but only 2 messages"):
        node_blocks(10, 3, 5)


def test_dfl_dp_export_holds_exactly_the_simulated_partition(tmp_path):
    from datasets.image_plan import build_image_plan
    from flower_apps.dfl_dp.data import data_key, eval_plan, node_clients

    rec = export("dfl-dp", 2, 0, tmp_path, "smoke")
    _, cfg = prepare({"study": "dfl-dp", "preset": "smoke", "seed": 0})
    plan = build_image_plan(data_key(cfg))
    seen = []
    for _i, name in enumerate(("node-0", "node-1")):
        node = node_clients(str(tmp_path / name), name)
        assert sorted(node.x) == rec["nodes"][name]["client_ids"]
        for cid in node.x:
            x, y = plan.client_data(cid)
            assert torch.equal(node.x[cid], x) and torch.equal(node.y[cid], y), cid
        seen += sorted(node.x)
        counts = node.label_counts()
        assert all(counts[c] == plan.class_counts()[c].tolist() for c in node.x)
    assert seen == list(range(cfg.num_clients))
    ev = eval_plan(type(cfg)(**{**cfg.__dict__, "node_local_data": True,
                                "eval_data_path": rec["run_config"]["eval-data-path"]}))
    assert torch.equal(ev.x["test"], plan.x["test"]) and torch.equal(ev.y["test"], plan.y["test"])
    assert ev.image_shape == tuple(plan.image_shape) and ev.num_classes == plan.num_classes


def test_tabular_export_holds_exactly_each_region_table(tmp_path):
    from flower_apps.tabular_pdp.data import client_table, data_key

    export("tabular-pdp", 3, 1, tmp_path, "smoke")
    _, cfg = prepare({"study": "tabular-pdp", "preset": "smoke", "seed": 1})
    got = {}
    for i in range(3):
        got.update(read_table_clients(read_manifest(node_folder(tmp_path / f"node-{i}", "tabular-pdp"),
                                                    "cancer-csv")))
    assert sorted(got) == list(range(cfg.num_clients))
    for cid, df in got.items():
        pd.testing.assert_frame_equal(df, client_table(data_key(cfg), cid), check_exact=True)


# ----------------------------------------------------------------------------- bad folders
def _image_node(root, **over):
    rng = np.random.default_rng(0)
    write_image_node(root, {3: (rng.integers(0, 255, (4, 8, 8), dtype=np.uint8), np.array([0, 1, 2, 1]))},
                     num_classes=3, mean=(0.5,), std=(0.25,), node="site-a")
    if over:
        m = json.loads((root / MANIFEST).read_text())
        m.update(over)
        (root / MANIFEST).write_text(json.dumps(m))
    return root


def test_image_node_round_trips(tmp_path):
    clients = read_image_clients(read_manifest(_image_node(tmp_path), "images-npz"))
    assert list(clients) == [3] and clients[3].x.shape == (4, 8, 8) and clients[3].y.tolist() == [0, 1, 2, 1]


@pytest.mark.parametrize("change, message", [
    ({"format": "cancer-csv"}, r"site-a: .*node\.json: format is 'cancer-csv', this study reads 'images-npz'"),
    ({"clients": {"3": "../elsewhere/client-3.npz"}}, r"client path '\.\./elsewhere/client-3\.npz' must be a relative"),
    ({"clients": {"3": "/etc/passwd"}}, r"must be a relative path inside the node's folder"),
    ({"clients": {"x": "client-3.npz"}}, r"client id 'x' is not an integer"),
    ({"clients": {"3": "client-9.npz"}}, r"site-a: .*client-9\.npz: missing"),
    ({"num_classes": 2}, r"site-a: .*client-3\.npz: labels must lie in \[0, 1\], got 0\.\.2"),
    ({"mean": [0.5, 0.5], "std": [1, 1]}, r"mean/std have 2 channel\(s\), the images 1"),
])
def test_malformed_image_node_names_node_file_and_problem(tmp_path, change, message):
    root = _image_node(tmp_path, **change)
    with pytest.raises(NodeDataError, match=message):
        read_image_clients(read_manifest(root, "images-npz"))


def test_missing_manifest_and_broken_npz(tmp_path):
    with pytest.raises(NodeDataError, match=r"site-b: .*node\.json: missing"):
        read_manifest(tmp_path, "images-npz", node="site-b")
    with pytest.raises(NodeDataError, match="is not a folder"):
        read_manifest(tmp_path / "nope", "images-npz", node="site-b")
    root = _image_node(tmp_path / "a")
    (root / "client-3.npz").write_bytes(b"not a zip")
    with pytest.raises(NodeDataError, match=r"site-a: .*client-3\.npz: not a readable \.npz"):
        read_image_clients(read_manifest(root, "images-npz"))
    np.savez(root / "client-3.npz", x=np.zeros((2, 8, 8), np.uint8))
    with pytest.raises(NodeDataError, match=r"missing array\(s\) \['y'\]"):
        read_image_clients(read_manifest(root, "images-npz"))
    with pytest.raises(NodeDataError, match="eval-data-path .*missing"):
        read_eval_set(tmp_path / "eval.npz")


def test_malformed_csv_names_node_file_and_column(tmp_path):
    from datasets.cancer import generate_cancer_table

    df = generate_cancer_table().head(20)
    write_table_node(tmp_path, {4: df.drop(columns=["Smoking"])}, node="country-x")
    with pytest.raises(NodeDataError, match=r"country-x: .*client-4\.csv: missing column\(s\) Smoking"):
        read_table_clients(read_manifest(tmp_path, "cancer-csv"))
    write_table_node(tmp_path, {4: df.assign(Age=["old"] * 20)}, node="country-x")
    with pytest.raises(NodeDataError, match=r"country-x: .*client-4\.csv: column Age must be numeric"):
        read_table_clients(read_manifest(tmp_path, "cancer-csv"))
    (tmp_path / "client-4.csv").write_text("")
    with pytest.raises(NodeDataError, match=r"country-x: .*client-4\.csv: not a readable CSV"):
        read_table_clients(read_manifest(tmp_path, "cancer-csv"))


def test_busi_folder_node_reads_its_layout_and_names_a_missing_class(tmp_path):
    import cv2

    from datasets.node_local import read_busi_clients, write_manifest

    site = tmp_path / "site"
    for k, cls in enumerate(("normal", "benign", "malignant")):
        (site / "c7" / cls).mkdir(parents=True)
        cv2.imwrite(str(site / "c7" / cls / f"{cls} (1).png"), np.full((8, 8), 40 * k, np.uint8))
    cv2.imwrite(str(site / "c7" / "benign" / "benign (1)_mask.png"), np.zeros((8, 8), np.uint8))
    write_manifest(site, "busi-folder", {7: "c7"}, node="hospital-u")
    (images,) = read_busi_clients(read_manifest(site, "busi-folder")).values()
    assert sorted(images.labels.tolist()) == [0, 1, 2] and len(images.images) == 3  # the mask is skipped
    import shutil

    shutil.rmtree(site / "c7" / "malignant")
    with pytest.raises(NodeDataError, match=r"hospital-u: .*c7: class folder\(s\) \['malignant'\] missing"):
        read_busi_clients(read_manifest(site, "busi-folder"))


def test_export_cli_refuses_more_nodes_than_messages_before_writing(tmp_path, capsys):
    from deploy.export import main

    # a clients-per-message given by the user is refused, not changed (without one the export fits it: 4)
    assert main(["--study", "dfl-dp", "--nodes", "3", "--preset", "smoke", "--run-config", "clients-per-message=5",
                 "--out", str(tmp_path / "x")]) == 1
    assert "export refused: 3 nodes but only 2 messages of clients-per-message=5" in capsys.readouterr().out
    assert not (tmp_path / "x").exists()
    assert main(["--study", "tabular-pdp", "--nodes", "2", "--preset", "smoke", "--run-config", "num-clients=1",
                 "--out", str(tmp_path / "y")]) == 1
    assert "num-clients" in capsys.readouterr().out and not (tmp_path / "y").exists()
