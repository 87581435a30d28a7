"""strategies.canaries: canary clients enter the aggregation before the noise, counted in the cohort."""

from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import MetricRecord

from privacy.audit import CanarySet, make_canaries
from strategies.base import PatternStrategy
from strategies.canaries import CanaryInsertion, WeightedCanaries, mix_into_weighted_mean
from strategies.records import from_numpy, to_numpy
from strategies.registry import build_strategy


def two_canaries() -> CanarySet:
    # canary 0 inserted, canary 1 held out; the model is w (2,) + b (1,) + an int counter (not audited)
    return CanarySet(np.array([[0.6, 0.0, 0.8], [0.0, 1.0, 0.0]]), np.array([True, False]), 1.0,
                     np.array([5, 5]))


def model(a: float, b: float, c: float) -> OrderedDict:
    return OrderedDict(w=np.array([a, b], dtype=np.float32), steps=np.array(3), b=np.array([c], dtype=np.float32))


class FixedResult(PatternStrategy):
    """An inner strategy that 'aggregates' to a fixed model from 4 real clients."""

    array_claims = "each"

    def __init__(self, result: OrderedDict) -> None:
        self.result = result

    def summary(self) -> None:
        pass

    def configure_train(self, server_round, arrays, config, grid):
        return []

    def aggregate_train(self, server_round, replies):
        return from_numpy(self.result), MetricRecord({"num-contributors": 4})


def test_weighted_mean_with_canaries_hand_case():
    cur = model(0.0, 0.0, 0.0)
    agg = model(1.0, 2.0, 3.0)  # weighted mean of the real replies, total weight 3
    out = mix_into_weighted_mean(agg, cur, 3.0, np.array([[4.0, 0.0, 0.0]]), np.array([1.0]))
    # (3 * (1, 2, 3) + 1 * (4, 0, 0)) / 4
    np.testing.assert_allclose(out["w"], [1.75, 1.5])
    np.testing.assert_allclose(out["b"], [2.25])
    assert out["steps"] == 3 and out["w"].dtype == np.float32
    with pytest.raises(ValueError, match="weights"):
        mix_into_weighted_mean(agg, cur, 3.0, np.zeros((1, 3)), np.array([0.0]))


@pytest.mark.parametrize("placement, expected", [
    ("cohort-mean", ([1.0 * 4 / 5 + 0.6 / 5, 2.0 * 4 / 5], [3.0 * 4 / 5 + 0.8 / 5])),  # mean of 4 real + 1 canary
    ("chain-end", ([1.6, 2.0], [3.8])),  # one more hop: the token plus the canary
])
def test_canary_insertion_adds_only_the_inserted_canaries(placement, expected):
    strat = CanaryInsertion(FixedResult(model(1.0, 2.0, 3.0)), two_canaries(), placement)
    strat.configure_train(1, from_numpy(model(0.0, 0.0, 0.0)), None, None)
    arrays, metrics = strat.aggregate_train(1, [])
    out = to_numpy(arrays)
    np.testing.assert_allclose(out["w"], expected[0], rtol=1e-6)
    np.testing.assert_allclose(out["b"], expected[1], rtol=1e-6)
    assert metrics["num-canaries"] == 1 and metrics["num-contributors"] == 4


def test_canary_insertion_refuses_a_model_of_another_size():
    strat = CanaryInsertion(FixedResult(model(1, 2, 3)), make_canaries(4, 7, 1.0, np.random.default_rng(0)),
                            "cohort-mean")
    with pytest.raises(ValueError, match="R\\^7"):
        strat.configure_train(1, from_numpy(model(0, 0, 0)), None, None)


def test_registry_refuses_canaries_without_dp_or_above_the_clip_norm():
    c = make_canaries(4, 3, 2.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="dp=True"):
        build_strategy("fl", [0, 1], "x", canaries=c)
    with pytest.raises(ValueError, match="exceed the clip norm"):
        build_strategy("fl", [0, 1], "x", dp=True, clip_norm=1.0, eps_cal=1.0, canaries=c)
    s = build_strategy("sequential-dfl", [0, 1], "x", dp=True, clip_norm=2.0, eps_cal=1.0, canaries=c)
    assert isinstance(s.strategy, CanaryInsertion) and s.strategy.placement == "chain-end"


def test_weighted_canaries_take_their_clients_weight_and_risk():
    w = WeightedCanaries(two_canaries(), {5: 30.0}, {5: 0.12})
    assert w.num_inserted == 1 and w.weights.tolist() == [30.0] and w.risks.tolist() == [0.12]
    # p_k C / sigma = (30 / 60) * 1 / 0.25
    assert w.signal_over_sigma(60.0, 0.25) == {5: pytest.approx(2.0)}
    with pytest.raises(ValueError, match="no weight for the client"):
        WeightedCanaries(two_canaries(), {4: 30.0})
