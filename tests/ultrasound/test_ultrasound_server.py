"""ServerApp + ClientApp logic end to end on an in-process fake grid (no Ray): every mode, DP, resume, report."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from flower_apps.common.results import read_json, read_jsonl
from flower_apps.config import RUN_CONFIG_DEFAULTS, ConfigError
from flower_apps.router import prepare
from flower_apps.ultrasound import client_app
from flower_apps.ultrasound.data import build_data, data_key
from flower_apps.ultrasound.report import write_report
from flower_apps.ultrasound.server_app import is_complete, run_dir, server_main

torch.set_num_threads(1)
TINY = {"study": "ultrasound", "preset": "smoke", "dataset": "synthetic", "num-clients": 2, "num-rounds": 2,
        "local-epochs": 1, "data-fraction": 0.25, "us-image-size": 32, "us-pretrained": False}


def cfg_of(tmp_path, **over):
    _, cfg = prepare({**RUN_CONFIG_DEFAULTS, **TINY, "results-dir": str(tmp_path), **over})
    return cfg


def grid_for(fake_grid_cls, nodes=(101, 102)):
    return fake_grid_cls(list(nodes), lambda node, msg: client_app.train(msg, Context(1, node, {}, RecordDict(), {})))


def test_federated_fedadam_with_dp_sgd(tmp_path, fake_grid_cls):
    cfg = cfg_of(tmp_path, **{"us-algorithm": "fedadam", "us-dp-sgd": True, "us-max-grad-norm": 1.5,
                              "us-noise-multiplier": 2.0})
    s = server_main(grid_for(fake_grid_cls, (101, 102, 103)), cfg)  # a third node is not asked
    out = run_dir(cfg)
    assert s["synthetic"] and s["method"] == "fedadam" and len(s["acc_curve"]) == 2
    data = build_data(data_key(cfg))
    for row, k in zip(s["accounting"]["per_client"], range(2)):
        n = len(data.client_train[k])
        batches = math.ceil(n / 32)
        assert row["sample_rate"] == pytest.approx(1 / batches)  # Opacus' actual rate, not B / n
        assert row["steps"] == 2 * 1 * batches  # T x E x (1 / q)
        assert 0 < row["eps_rdp"] < row["eps_paper_sqrtT"]
    com = s["communication"]
    assert com["bytes_per_round"] == 2 * com["num_params"] * 4 * 2
    model = read_json(out / "model.json")
    assert model["dp_model_changes"] and model["timm_name"] == "mobilenetv2_100"
    rounds = read_jsonl(out / "rounds.jsonl")
    assert [r["round"] for r in rounds] == [1, 2] and all(r["clients_replied"] == 2 for r in rounds)
    assert all(r["round_seconds"] > 0 and r["step_seconds_mean"] > 0 for r in rounds)
    assert s["timing"]["trunk_cached_share"] == 0.0  # every client said; the whole network trained (frozen-bn)
    for f in ("summary.json", "config.json", "table2_partition.md", "metrics.csv", "per_client.md", "accounting.md",
              "communication.md", "dp_model_changes.csv", "confusion_matrix.csv", "confusion_matrix.png",
              "convergence.png"):
        assert (out / f).is_file(), f
    assert np.asarray(s["confusion"]).sum() == s["n_test"]
    assert is_complete(cfg) and not is_complete(cfg_of(tmp_path, seed=1))


def test_fedprox_centralized_local_and_the_report(tmp_path, fake_grid_cls):
    grid = grid_for(fake_grid_cls)
    prox = server_main(grid, cfg_of(tmp_path, **{"us-algorithm": "fedprox", "us-partition": "iid"}))
    assert prox["proximal_mu"] == pytest.approx(0.01) and prox["communication"] is not None
    # resume: DP knobs cannot change a non-DP run, mu can change a FedProx run
    assert is_complete(cfg_of(tmp_path, **{"us-algorithm": "fedprox", "us-partition": "iid",
                                           "us-noise-multiplier": 3.0}))
    assert not is_complete(cfg_of(tmp_path, **{"us-algorithm": "fedprox", "us-partition": "iid",
                                               "us-proximal-mu": 0.1}))
    cen = server_main(grid, cfg_of(tmp_path, **{"us-mode": "centralized", "us-partition": "iid"}))
    assert cen["communication"] is None and len(cen["acc_curve"]) == 2 and len(cen["per_client"]) == 2
    loc = server_main(grid, cfg_of(tmp_path, **{"us-mode": "local", "us-partition": "iid"}))
    assert len(loc["per_client"]) == 2 and "test_accuracy" in loc["per_client"][0]
    assert loc["test_accuracy"] == pytest.approx(np.mean([c["test_accuracy"] for c in loc["per_client"]]))
    assert len(loc["acc_curve"]) == 2
    md = write_report(tmp_path)
    out = tmp_path / "ultrasound"
    assert "SYNTHETIC" in md and "15,847" in md
    for f in ("table5_10_results.md", "table11_summary.md", "table_per_client.md", "table4_communication.md",
              "report.md"):
        assert (out / f).is_file(), f
    t11 = (out / "table11_summary.csv").read_text()
    assert "FedProx" in t11 and "mobilenetv2_100" in t11
    # the constant-predictor baseline, from the test labels: the most frequent class's share
    cm = np.asarray(prox["confusion"])
    majority = f"{100 * cm.sum(1).max() / cm.sum():.2f}"
    header, row = t11.splitlines()[:2]
    assert "majority-class acc (%)" in header and "FL AUC (%)" in header and majority in row
    rows = (out / "table5_10_results.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 and any("Local-only" in r for r in rows)
    assert list(out.glob("figure_convergence_*.png"))


def test_config_errors_name_the_key_and_allowed_values(tmp_path):
    with pytest.raises(ConfigError, match=r"us-arch: got 'resnet18'; allowed: \["):
        cfg_of(tmp_path, **{"us-arch": "resnet18"})
    with pytest.raises(ConfigError, match="us-image-size: .*divisible by 16"):
        cfg_of(tmp_path, **{"us-arch": "vit_small_patch16_224", "us-image-size": 40})
    with pytest.raises(ConfigError, match="smoke preset only"):
        prepare({**RUN_CONFIG_DEFAULTS, **TINY, "preset": "cpu"})
    with pytest.raises(ConfigError, match="BreastMNIST is binary"):
        cfg_of(tmp_path, dataset="breastmnist")
    paper = prepare({**RUN_CONFIG_DEFAULTS, "study": "ultrasound"})[1]  # the default preset is the paper's
    assert (paper.num_clients, paper.num_rounds, paper.local_epochs, paper.batch_size, paper.lr, paper.image_size) == (
        8, 100, 5, 32, 1e-3, 224)
    assert (paper.proximal_mu, paper.server_lr, paper.beta1, paper.beta2, paper.delta) == (0.01, 0.01, 0.9, 0.99, 1e-5)
    assert json.loads(paper.to_json())["dataset"] == "busi"


def test_centralized_trains_on_every_thread_of_the_process(tmp_path, fake_grid_cls, monkeypatch):
    """The centralized baseline trains while the client actors sit idle: no cap at half the cores (it made
    the cpu grid's centralized runs on 2 cores train on one thread); the count is recorded, since it changes
    the float summation order."""
    from flower_apps.ultrasound import server_app

    seen: list[int] = []
    real = server_app.train_local

    def spy(*a, **k):
        seen.append(torch.get_num_threads())
        return real(*a, **k)

    monkeypatch.setattr(server_app, "train_local", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cen = server_main(grid_for(fake_grid_cls), cfg_of(tmp_path, **{"us-mode": "centralized", "us-partition": "iid"}))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen == [2] and cen["timing"]["torch_threads"] == 2
