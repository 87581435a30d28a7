"""A federated run stopped after round r resumes at round r + 1 and ends as the uninterrupted run does
(strategies.resume): same global model, curves and DP ledger; a checkpoint of another config is never used."""

from __future__ import annotations

import pytest
import torch
from flwr.app import Context, RecordDict

from flower_apps.common.results import read_jsonl
from flower_apps.config import RUN_CONFIG_DEFAULTS
from flower_apps.router import prepare
from flower_apps.ultrasound import client_app
from flower_apps.ultrasound.server_app import run_dir, server_main
from strategies.resume import CHECKPOINT, load_checkpoint

torch.set_num_threads(1)
TINY = {"study": "ultrasound", "preset": "smoke", "dataset": "synthetic", "num-clients": 2, "num-rounds": 3,
        "local-epochs": 1, "data-fraction": 0.25, "us-image-size": 32, "us-pretrained": False}


class Stop(Exception):
    """The 'kill' of a run between rounds."""


def cfg_of(tmp_path, **over):
    _, cfg = prepare({**RUN_CONFIG_DEFAULTS, **TINY, "results-dir": str(tmp_path), **over})
    return cfg


def grid(fake_grid_cls, stop_at_round=None, node_config=None):
    def handler(node, msg):
        if stop_at_round is not None and int(msg.content["config"]["server-round"]) >= stop_at_round:
            raise Stop(f"stopped before round {stop_at_round}")
        return client_app.train(msg, Context(1, node, dict(node_config or {}), RecordDict(), {}))

    return fake_grid_cls([101, 102], handler)


def rounds_sent(g) -> list[int]:
    return sorted({int(m.content["config"]["server-round"]) for _, m in g.log})


@pytest.mark.parametrize("over", [
    {"us-algorithm": "fedadam"},  # server moments m_t, v_t and FedAdam's round-dependent bias correction
    {"us-algorithm": "fedavg", "us-dp-sgd": True, "us-max-grad-norm": 1.5, "us-noise-multiplier": 2.0},  # DP ledger
], ids=["fedadam", "fedavg-dp"])
def test_a_stopped_run_resumes_after_its_last_round_and_ends_as_the_uninterrupted_one(tmp_path, fake_grid_cls, over):
    secret = tmp_path / "noise-seed"
    secret.write_text("a local secret")  # DP noise from a local secret: bit-reproducible, so runs compare exactly
    # each node's own seed file (its --node-config noise-seed-file); the run config only asks for seeded noise
    node = {"noise-seed-file": str(secret)}
    over = {**over, "us-noise-mode": "seeded"} if over.get("us-dp-sgd") else over
    whole = cfg_of(tmp_path / "whole", **over)
    s_whole = server_main(grid(fake_grid_cls, node_config=node), whole)

    cfg = cfg_of(tmp_path / "resumed", **over)
    with pytest.raises(Stop):
        server_main(grid(fake_grid_cls, stop_at_round=3, node_config=node), cfg)
    out = run_dir(cfg)
    assert not (out / "summary.json").exists() and (out / CHECKPOINT).is_file()
    assert [r["round"] for r in read_jsonl(out / "rounds.jsonl")] == [1, 2]

    g = grid(fake_grid_cls, node_config=node)
    s = server_main(g, cfg)
    assert rounds_sent(g) == [3]  # rounds 1-2 were not run again
    assert s["timing"]["resumed_after_rounds"] == [2] and s_whole["timing"]["resumed_after_rounds"] == []
    assert not (out / CHECKPOINT).exists()  # finished: the checkpoint is gone
    assert s["acc_curve"] == s_whole["acc_curve"] and s["test_accuracy"] == s_whole["test_accuracy"]
    assert len(s["timing"]["round_seconds"]) == 3
    a = torch.load(out / "final_model.pt", weights_only=True)
    b = torch.load(run_dir(whole) / "final_model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if whole.dp_sgd:  # the ledger counts every round's steps, also those before the stop
        assert s["accounting"] == s_whole["accounting"]


def test_a_checkpoint_of_another_config_is_not_resumed_from(tmp_path, fake_grid_cls):
    cfg = cfg_of(tmp_path, lr=1e-3)
    with pytest.raises(Stop):
        server_main(grid(fake_grid_cls, stop_at_round=2), cfg)
    other = cfg_of(tmp_path, lr=2e-3)  # same run folder (lr is not in its name), another run
    assert run_dir(other) == run_dir(cfg) and load_checkpoint(run_dir(cfg), "another run") is None
    g = grid(fake_grid_cls)
    s = server_main(g, other)
    assert rounds_sent(g) == [1, 2, 3] and s["timing"]["resumed_after_rounds"] == []
