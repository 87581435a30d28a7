"""strategies.reply_rules: each rule fires on a broken reply and passes an honest one."""

import math
from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from strategies.records import from_numpy
from strategies.reply_rules import ReplyRules, reply_problem

MODEL = OrderedDict(w=np.zeros((2, 3), np.float32), b=np.zeros(3, np.float32))


def _sent() -> Message:
    return Message(RecordDict({"arrays": from_numpy(MODEL), "config": ConfigRecord({"client-ids": [0]})}),
                   dst_node_id=1, message_type="train")


def _reply(model=MODEL, **metrics) -> Message:
    m = {"num-examples": 10, "train-loss": 0.5, **metrics}
    return Message(RecordDict({"arrays": from_numpy(model), "metrics": MetricRecord(m)}), reply_to=_sent())


def test_honest_reply_passes():
    assert reply_problem(_sent(), _reply(), (0,), "none", ReplyRules(max_examples=10)) is None


@pytest.mark.parametrize("model,word", [
    (OrderedDict(w=np.full((2, 3), np.nan, np.float32), b=MODEL["b"]), "non-finite"),
    (OrderedDict(w=np.zeros(1, np.float32), b=MODEL["b"]), "shape"),
    (OrderedDict(w=MODEL["w"].astype(np.int32), b=MODEL["b"]), "dtype"),
    (OrderedDict(w=MODEL["w"]), "missing"),
    (OrderedDict(w=MODEL["w"], b=MODEL["b"], x=MODEL["b"]), "extra"),
    (OrderedDict(w=MODEL["w"] + 1e30, b=MODEL["b"]), "beyond"),
])
def test_broken_models_are_refused(model, word):
    assert word in reply_problem(_sent(), _reply(model), (0,), "none")


@pytest.mark.parametrize("n", [-299, 0, 11, 2.5, math.nan])
def test_sizes_outside_the_bound_are_refused(n):
    assert "num-examples" in reply_problem(_sent(), _reply(**{"num-examples": n}), (0,), "none",
                                           ReplyRules(max_examples=10))


def test_committed_size_and_exact_metric_keys():
    rules = ReplyRules(committed_examples={0: 9}, metric_keys=frozenset({"num-examples", "train-loss"}))
    assert "committed" in reply_problem(_sent(), _reply(), (0,), "none", rules)
    assert "unexpected" in reply_problem(_sent(), _reply(evil=1.0), (0,), "none",
                                         ReplyRules(metric_keys=frozenset({"num-examples", "train-loss"})))


def test_a_reply_without_a_metric_the_aggregation_reads_is_refused_not_a_crash():
    """EqualWeightFedAvg and SequentialDFL read train-loss and num-examples: a reply without them is a
    rejected reply (the round goes on), never a KeyError in the server."""
    from flwr.app import Message as Msg

    from strategies.registry import build_strategy

    rules = ReplyRules(required_metrics=frozenset({"train-loss"}))
    no_loss = Msg(RecordDict({"arrays": from_numpy(MODEL), "metrics": MetricRecord({"num-examples": 10})}),
                  reply_to=_sent())
    assert "missing ['train-loss']" in reply_problem(_sent(), no_loss, (0,), "none", rules)
    assert reply_problem(_sent(), _reply(), (0,), "none", rules) is None
    for framework in ("fl", "sequential-dfl"):
        strategy = build_strategy(framework, [0, 1], "x", dp=True, clip_norm=1.0, eps_cal=1.0)
        assert strategy.reply_rules_in_force().required_metrics == {"num-examples", "train-loss"}
