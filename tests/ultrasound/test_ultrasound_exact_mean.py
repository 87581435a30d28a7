"""An array every client returns unchanged aggregates to itself, bit for bit (strategies/exact_mean.py), in the
ultrasound study's FedAvg / FedProx / FedAdam; arrays that differ are aggregated as Flower does."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from flower_apps.ultrasound.strategy import build_ultrasound_strategy
from strategies.cohorts import client_ids_of
from strategies.exact_mean import consensus_arrays, exact_weighted_mean

RNG = np.random.default_rng(0)
FROZEN = RNG.normal(size=64).astype(np.float32)  # the same in every reply: a frozen trunk
FROZEN_BUF = RNG.uniform(0.5, 2.0, size=16).astype(np.float32)  # a frozen BatchNorm's running variance
EXAMPLES = {0: 7, 1: 13, 2: 29}  # weights whose float32 weighted sum of identical values is not exact


def _start() -> ArrayRecord:
    return ArrayRecord({"trunk": Array(FROZEN.copy()), "head": Array(np.zeros(4, np.float32)),
                        "bn.running_var": Array(FROZEN_BUF.copy())})


def _handler(node, msg):
    (cid,) = client_ids_of(msg.content["config"])
    arrays = ArrayRecord({"trunk": Array(FROZEN.copy()), "head": Array(np.full(4, 0.1 * (cid + 1), np.float32)),
                          "bn.running_var": Array(FROZEN_BUF.copy())})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(
        {"num-examples": EXAMPLES[cid], "client-id": cid, "client-ids": [cid]})}), reply_to=msg)


def _records():
    return [RecordDict({"arrays": ArrayRecord({"trunk": Array(FROZEN.copy()), "x": Array(np.full(3, float(c), np.float32))}),
                        "metrics": MetricRecord({"num-examples": n})}) for c, n in EXAMPLES.items()]


def test_flowers_mean_moves_an_array_nobody_changed_and_the_exact_mean_does_not():
    plain = aggregate_arrayrecords(_records(), "num-examples")
    assert not np.array_equal(plain["trunk"].numpy(), FROZEN)  # the rounding this module removes
    exact = exact_weighted_mean(_records(), "num-examples")
    assert np.array_equal(exact["trunk"].numpy(), FROZEN) and exact["trunk"].numpy().dtype == np.float32
    np.testing.assert_array_equal(exact["x"].numpy(), plain["x"].numpy())  # differing arrays: Flower's mean


def test_consensus_needs_every_record_bit_for_bit():
    recs = _records()
    assert set(consensus_arrays(recs)) == {"trunk"}
    changed = FROZEN.copy()
    changed[5] = np.nextafter(changed[5], np.float32(np.inf))  # one ulp in one record
    recs[2]["arrays"]["trunk"] = Array(changed)
    assert consensus_arrays(recs) == {}
    assert consensus_arrays([]) == {}


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "fedadam"])
def test_a_frozen_trunk_stays_bit_identical_over_rounds(fake_grid_cls, algorithm):
    grid = fake_grid_cls([11, 12, 13], _handler)
    strategy = build_ultrasound_strategy(algorithm, server_lr=0.01, buffer_keys=["bn.running_var"])
    strategy.set_cohort(range(3), "ultrasound")
    arrays = _start()
    for rnd in (1, 2, 3):
        msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord({"run-config": "{}"}), grid))
        arrays, _ = strategy.aggregate_train(rnd, grid.send_and_receive(msgs))
        assert np.array_equal(arrays["trunk"].numpy(), FROZEN), (algorithm, rnd)
        assert np.array_equal(arrays["bn.running_var"].numpy(), FROZEN_BUF), (algorithm, rnd)
        assert not np.array_equal(arrays["head"].numpy(), np.zeros(4, np.float32))  # the head is aggregated
    if algorithm != "fedadam":  # weighted mean of 0.1, 0.2, 0.3 with weights 7, 13, 29
        np.testing.assert_allclose(arrays["head"].numpy(), (0.1 * 7 + 0.2 * 13 + 0.3 * 29) / 49, rtol=1e-6)
    else:
        assert np.all(strategy.m_t["trunk"] == 0) and np.all(strategy.v_t["trunk"] == 0)
