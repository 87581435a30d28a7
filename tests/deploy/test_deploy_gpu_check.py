"""benchmarks/gpu_check.py's bookkeeping, on a fake grid (the GPU runs themselves need a GPU).

The script answers "did the ClientApps use CUDA, and how long did a round take" from a
grid proxy; these tests pin that the proxy attributes replies to rounds, reads the ``cuda``
flag from every MetricRecord, counts error replies and times rounds end to end.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _train(node: int, rnd: int) -> Message:
    return Message(RecordDict({"config": ConfigRecord({"server-round": rnd})}), dst_node_id=node,
                   message_type="train.x")


def test_recording_grid_attributes_replies_flags_and_errors(gpu_check, fake_grid_cls):
    def handler(node, msg):
        return Message(RecordDict({"metrics": MetricRecord({"cuda": int(node == 1), "train-loss": 0.5})}),
                       reply_to=msg)

    fake = fake_grid_cls([1, 2, 3], handler, fail_nodes={3})
    rec = gpu_check.RecordingGrid(fake)
    assert rec.get_node_ids() == [1, 2, 3]  # everything else is delegated
    got1 = rec.send_and_receive([_train(n, 1) for n in (1, 2, 3)])
    got2 = rec.send_and_receive([_train(n, 2) for n in (1, 2)])
    assert len(got1) == 3 and len(got2) == 2
    end = rec.rounds[2]["start"] + 1.0
    rounds = rec.summary(end)
    assert [r["round"] for r in rounds] == [1, 2]
    assert sorted(rounds[0]["cuda"]) == [0, 1] and rounds[0]["errors"] == 1
    assert sorted(rounds[1]["cuda"]) == [0, 1] and rounds[1]["errors"] == 0
    # Round 1 lasts until round 2 starts; the last round until the ServerApp ends.
    assert rounds[0]["seconds"] == pytest.approx(rec.rounds[2]["start"] - rec.rounds[1]["start"])
    assert rounds[1]["seconds"] == pytest.approx(1.0)


def test_per_round_separates_the_warm_up_round(gpu_check):
    res = {"rounds": [{"seconds": 10.0}, {"seconds": 2.0}, {"seconds": 4.0}]}
    assert gpu_check.per_round(res) == (10.0, 3.0)
    assert gpu_check.per_round({"rounds": [{"seconds": 5.0}]}) == (5.0, None)
    assert gpu_check.per_round({}) == (None, None)


def test_environment_check_names_what_is_missing(gpu_check, monkeypatch):
    missing, facts = gpu_check.environment()
    assert missing == [] and facts["flwr"] and facts["torch"]
    monkeypatch.setattr(gpu_check, "REQUIRED", ("flwr", "surely_not_installed_pkg"))
    missing, _ = gpu_check.environment()
    assert missing == ["surely_not_installed_pkg"]
