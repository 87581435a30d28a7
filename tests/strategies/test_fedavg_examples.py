"""Example-weighted FedAvg (strategies.fedavg_examples) and the per-client metrics kept after the plan check."""

from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from privacy.audit.canaries import make_canaries
from strategies.canaries import CanaryInsertion
from strategies.fedavg_equal import EqualWeightFedAvg, equal_weight_mean
from strategies.fedavg_examples import ExampleWeightedFedAvg, example_weighted_mean
from strategies.layer import set_reply_rules
from strategies.matched_perturbation import MatchedPerturbation
from strategies.observer import RoundObserver
from strategies.records import client_key, from_numpy, to_numpy
from strategies.registry import FRAMEWORKS, build_strategy, supports_dp
from strategies.reply_rules import ReplyRules

SHAPES = {"w": (2, 3), "b": (3,)}


def model_of(value: float) -> OrderedDict:
    return OrderedDict((k, np.full(s, value, dtype=np.float32)) for k, s in SHAPES.items())


def handler_for(values: dict[int, float], examples: dict[int, int], forge: dict[int, int] | None = None):
    """Client c replies ``model_of(values[c])`` and ``num-examples = examples[c]``; ``forge``: client c
    speaks for another client instead (its model under that client's key)."""
    forge = forge or {}

    def handler(node: int, msg: Message) -> Message:
        cids = [int(c) for c in msg.content["config"]["client-ids"]]
        out = RecordDict()
        for cid in cids:
            out[client_key(forge.get(cid, cid))] = from_numpy(model_of(values[cid]))
        out["metrics"] = MetricRecord({"num-examples": sum(examples[c] for c in cids), "train-loss": 0.5,
                                       "client-ids": [forge.get(c, c) for c in cids]})
        return Message(out, reply_to=msg)

    return handler


def one_round(strategy, grid, rnd: int = 1):
    g = strategy.prepare_grid(grid)
    msgs = list(strategy.configure_train(rnd, from_numpy(model_of(0.0)), ConfigRecord({"run-config": "{}"}), g))
    return strategy.aggregate_train(rnd, g.send_and_receive(msgs, timeout=5))


def test_hand_computed_weighted_mean(fake_grid_cls):
    # (1 * 1 + 3 * 2 + 4 * 4) / (1 + 3 + 4) = 23 / 8
    grid = fake_grid_cls([1, 2, 3], handler_for({0: 1.0, 1: 2.0, 2: 4.0}, {0: 1, 1: 3, 2: 4}))
    arrays, metrics = one_round(ExampleWeightedFedAvg([0, 1, 2], "x"), grid)
    out = to_numpy(arrays)
    assert list(out) == list(SHAPES) and all(out[k].dtype == np.float32 for k in SHAPES)
    np.testing.assert_array_equal(out["w"], np.float32(23 / 8))
    assert metrics["num-contributors"] == 3 and metrics["num-failed"] == 0


@pytest.mark.parametrize("n", [1, 7, 1000])
def test_equal_example_counts_give_the_equal_weight_mean(n):
    rng = np.random.default_rng(n)
    models = [OrderedDict((k, rng.normal(size=s).astype(np.float32)) for k, s in SHAPES.items()) for _ in range(3)]
    weighted, equal = example_weighted_mean(models, [n] * 3), equal_weight_mean(models)
    for k in SHAPES:
        np.testing.assert_allclose(weighted[k], equal[k], rtol=1e-6, atol=1e-7)


def test_a_reply_claiming_too_many_examples_is_refused_not_weighted(fake_grid_cls):
    grid = fake_grid_cls([1, 2, 3], handler_for({0: 1.0, 1: 3.0, 2: 100.0}, {0: 1, 1: 1, 2: 10**6}))
    s = ExampleWeightedFedAvg([0, 1, 2], "x")
    set_reply_rules(s, ReplyRules(max_examples=50))
    arrays, metrics = one_round(s, grid)
    np.testing.assert_array_equal(to_numpy(arrays)["w"], np.float32(2.0))  # clients 0 and 1 only, equal weights
    assert metrics["num-contributors"] == 2 and metrics["num-failed"] == 1
    assert "num-examples" in s.problems[1][2]
    assert sorted(s.client_metrics[1]) == [0, 1]


def test_client_metrics_hold_only_the_replies_that_passed(fake_grid_cls):
    # client 1 forges a reply for client 0; every plan-checked layer keeps the honest clients only
    grid = fake_grid_cls([1, 2, 3], handler_for({0: 1.0, 1: 2.0, 2: 4.0}, {0: 5, 1: 6, 2: 7}, forge={1: 0}))
    s = build_strategy("fl", [0, 1, 2], "x", dp=True, clip_norm=1.0, eps_cal=1e6)
    _, metrics = one_round(s, grid)
    assert metrics["num-contributors"] == 2
    for layer in (s, s.strategy):
        assert layer.client_metrics[1] == {0: {"num-examples": 5, "train-loss": 0.5, "client-ids": [0]},
                                           2: {"num-examples": 7, "train-loss": 0.5, "client-ids": [2]}}


def test_packed_clients_share_their_reply_metrics(fake_grid_cls):
    grid = fake_grid_cls([1, 2], handler_for({c: 1.0 for c in range(3)}, {0: 2, 1: 3, 2: 4}))
    s = EqualWeightFedAvg([0, 1, 2], "x", clients_per_message=2)
    one_round(s, grid)
    assert s.client_metrics[1][0] == s.client_metrics[1][1] == {"num-examples": 5, "train-loss": 0.5,
                                                                 "client-ids": [0, 1]}
    assert s.client_metrics[1][2]["num-examples"] == 4


def test_registry_lists_the_example_weighted_framework():
    assert FRAMEWORKS["fedavg-examples"][0] is ExampleWeightedFedAvg and not supports_dp("fedavg-examples")
    assert FRAMEWORKS["fl"] == (EqualWeightFedAvg, "client") and supports_dp("fl")  # "fl" unchanged
    assert isinstance(build_strategy("fedavg-examples", [0, 1], "x"), ExampleWeightedFedAvg)


def test_dp_wrappers_refuse_example_weights():
    """Matched perturbation's sigma_abs is sized for equal weights: a weighted mean would be under-noised."""
    with pytest.raises(ValueError, match="no DP variant"):
        build_strategy("fedavg-examples", [0, 1], "x", dp=True, clip_norm=1.0, eps_cal=1.0)
    for inner in (ExampleWeightedFedAvg([0, 1], "x"), RoundObserver(ExampleWeightedFedAvg([0, 1], "x"))):
        with pytest.raises(ValueError, match="equal-weight"):
            MatchedPerturbation(inner, 1.0, 1.0, 1e-5, "client")
    canaries = make_canaries(2, 9, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="equal-weight"):
        CanaryInsertion(ExampleWeightedFedAvg([0, 1], "x"), canaries, "cohort-mean")


def test_packed_messages_and_bad_weights_are_refused():
    with pytest.raises(ValueError, match="clients_per_message = 1"):
        ExampleWeightedFedAvg([0, 1], "x", clients_per_message=2)
    with pytest.raises(ValueError, match="> 0"):
        example_weighted_mean([model_of(1.0)], [0.0])
    with pytest.raises(ValueError, match="zero models"):
        example_weighted_mean([], [])
