"""The ServerApp's world end to end on an in-process grid: churn, Byzantine fragments, curious recipient."""

import pytest
import torch

import flower_apps.studies  # noqa: F401  (registers the study keys)
from flower_apps.common.results import read_jsonl
from flower_apps.config import RUN_CONFIG_DEFAULTS
from flower_apps.unlinkable_dfl import client_app, server_app
from flower_apps.unlinkable_dfl.config import PRESETS, build_config

torch.set_num_threads(1)


def _run(fake_grid_cls, tmp_path, **over):
    flat = {**RUN_CONFIG_DEFAULTS, **PRESETS["smoke"], "study": "unlinkable-dfl", "preset": "smoke",
            "results-dir": str(tmp_path), "udfl-eval-samples": 200, **over}
    cfg = build_config(flat)
    grid = fake_grid_cls([1, 2], lambda node, msg: client_app.train(msg, None))
    summary = server_app.server_main(grid, cfg)
    return summary, read_jsonl(server_app.run_dir(cfg) / "rounds.jsonl"), grid


def test_churn_crashes_nodes_mid_round_and_the_run_goes_on(fake_grid_cls, tmp_path):
    summary, rounds, grid = _run(fake_grid_cls, tmp_path, **{"num-clients": 7, "num-rounds": 3,
                                 "udfl-churn-leave": 0.3, "udfl-churn-join": 1.0})
    departed = [r["departed"] for r in rounds]
    assert any(departed), departed
    first = next(r for r in rounds if r["departed"])
    assert first["aggregating_nodes"] == first["live_nodes"] - len(first["departed"])
    assert first["completeness"] < 1.0  # fragments to and from crashed nodes are lost
    later = rounds[rounds.index(first) + 1]
    assert set(first["departed"]) <= set(later["rejoined"])  # join probability 1: they come back
    assert all(0 <= r["test_acc"] <= 1 for r in rounds)
    assert {m.metadata.message_type for _, m in grid.log} == {"train.unlinkable_dfl"}  # both steps make models
    phases = [m.content["config"]["phase"] for _, m in grid.log]
    runs = [p for k, p in enumerate(phases) if k == 0 or p != phases[k - 1]]
    assert runs == ["train", "aggregate"] * 3  # every round: all train messages, then all aggregate messages


def test_fragkrum_resists_scaled_byzantine_fragments_where_fragfedavg_fails(fake_grid_cls, tmp_path):
    common = {"num-clients": 6, "num-rounds": 2, "udfl-topology": "full-mesh", "udfl-mixnet": False,
              "udfl-byzantine-fraction": 0.17, "udfl-byzantine-attack": "scaled", "udfl-krum-budget": 1}
    krum, krum_rounds, _ = _run(fake_grid_cls, tmp_path, **common, **{"udfl-aggregator": "krum",
                                                                      "udfl-curious-node": 0})
    avg, _, _ = _run(fake_grid_cls, tmp_path, **common, **{"udfl-aggregator": "fedavg"})
    assert len(krum["byzantine_nodes"]) == 1
    assert krum["krum_ranges"] > 0 and krum["krum_fallback_ranges"] == 0  # n_r = 6 > 2 B + 2
    assert krum["final_acc"] > avg["final_acc"] + 0.2, (krum["final_acc"], avg["final_acc"])
    assert all(r["completeness"] == 1.0 and r["coverage"] == 1.0 for r in krum_rounds)
    # the curious-recipient analysis ran at node 0: 5 senders, round 2's 5 x 7 fragments scored
    cl = krum["content_linking"]
    assert (cl["senders"], cl["fragments"]) == (5, 35) and cl["chance"] == pytest.approx(1 / 5)
    assert 0 <= cl["identity_accuracy"] <= 1 and 0 <= cl["bucket_accuracy"] <= 1
