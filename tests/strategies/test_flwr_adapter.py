"""strategies/flwr_adapter.py against stock Flower 1.42: the mean equals FedAvg's, the FedOpt hook leaves FedAdam's
step as it is unless it edits the mean, clip and sigma equal Flower's DP wrapper's, the parser and the task
identity behave as Flower's."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg, FedYogi

from strategies import flwr_adapter
from strategies.exact_mean import ExactConsensusMean
from strategies.flwr_adapter import FedOptMeanHook, weighted_mean_arrays

EXAMPLES = {11: 7, 12: 13, 13: 29}


def _arrays(node: int, rnd: int) -> ArrayRecord:
    g = np.random.default_rng([node, rnd])
    return ArrayRecord({"w": Array(g.normal(size=(2, 3)).astype(np.float32)),
                        "b": Array(g.normal(size=3).astype(np.float32))})


def _handler(rnd: int):
    def handle(node, msg):
        return Message(RecordDict({"arrays": _arrays(node, rnd),
                                   "metrics": MetricRecord({"num-examples": EXAMPLES[node]})}), reply_to=msg)
    return handle


def _rounds(strategy, fake_grid_cls, rounds: int = 2) -> list[dict[str, np.ndarray]]:
    arrays = ArrayRecord({"w": Array(np.zeros((2, 3), np.float32)), "b": Array(np.zeros(3, np.float32))})
    out = []
    for rnd in range(1, rounds + 1):
        grid = fake_grid_cls(list(EXAMPLES), _handler(rnd))
        msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord({}), grid))
        replies = sorted(grid.send_and_receive(msgs), key=lambda r: r.metadata.src_node_id)  # Flower samples in
        arrays, _ = strategy.aggregate_train(rnd, replies)  # random order: the float32 sum's order fixed here
        out.append({k: v.numpy().copy() for k, v in arrays.items()})
    return out


def test_weighted_mean_equals_stock_fedavg_bit_for_bit(fake_grid_cls):
    grid = fake_grid_cls(list(EXAMPLES), _handler(1))
    start = ArrayRecord({"w": Array(np.zeros((2, 3), np.float32)), "b": Array(np.zeros(3, np.float32))})
    stock = FedAvg(fraction_evaluate=0.0)
    replies = grid.send_and_receive(list(stock.configure_train(1, start, ConfigRecord({}), grid)))
    arrays, _ = stock.aggregate_train(1, replies)
    ours = weighted_mean_arrays([r.content for r in replies], "num-examples")
    assert set(ours) == set(arrays) == {"w", "b"}
    for k in arrays:
        assert np.array_equal(ours[k].numpy(), arrays[k].numpy()) and ours[k].numpy().dtype == np.float32
    w = np.array(list(EXAMPLES.values()), dtype=np.float64)
    by_hand = sum(_arrays(n, 1)["b"].numpy().astype(np.float64) * x for n, x in zip(EXAMPLES, w)) / w.sum()
    np.testing.assert_allclose(ours["b"].numpy(), by_hand, rtol=1e-5, atol=1e-6)


class _HookedAdam(FedOptMeanHook, FedAdam):
    pass


class _ZeroB(FedOptMeanHook, FedAdam):
    def adjust_fedopt_mean(self, aggregated: ArrayRecord) -> ArrayRecord:
        return ArrayRecord({k: Array(np.zeros_like(v.numpy())) if k == "b" else v for k, v in aggregated.items()})


class _ExactAdam(ExactConsensusMean, FedAdam):
    pass


class _ExactYogi(ExactConsensusMean, FedYogi):
    pass


@pytest.mark.parametrize("ours,stock", [(_HookedAdam, FedAdam), (_ExactAdam, FedAdam), (_ExactYogi, FedYogi)])
def test_the_fedopt_hook_leaves_stock_fedopt_steps_unchanged(fake_grid_cls, ours, stock):
    """No array agrees across replies here, so ExactConsensusMean must not move FedAdam / FedYogi by a bit."""
    kw = {"fraction_evaluate": 0.0, "eta": 0.05}
    a, b = _rounds(ours(**kw), fake_grid_cls), _rounds(stock(**kw), fake_grid_cls)
    for ra, rb in zip(a, b):
        for k in rb:
            assert np.array_equal(ra[k], rb[k]), k
    assert flwr_adapter.is_fedopt(ours(**kw)) and not flwr_adapter.is_fedopt(FedAvg())


def test_the_fedopt_hook_runs_on_the_mean_before_the_pseudo_gradient(fake_grid_cls):
    strategy = _ZeroB(fraction_evaluate=0.0, eta=0.05)
    hooked, stock = _rounds(strategy, fake_grid_cls, 1), _rounds(FedAdam(fraction_evaluate=0.0, eta=0.05), fake_grid_cls, 1)
    assert np.array_equal(hooked[0]["w"], stock[0]["w"])  # untouched key: stock FedAdam's step
    assert np.all(strategy.m_t["b"] == 0) and np.all(hooked[0]["b"] == 0)  # mean = current: no step, no moment
    assert not np.all(stock[0]["b"] == 0)


def test_clip_and_sigma_are_flowers_dp_wrapper_math():
    rng = np.random.default_rng(0)
    current = [rng.normal(size=(3, 2)), rng.normal(size=4)]
    params = [c + 5 * rng.normal(size=c.shape) for c in current]
    expected = [p.copy() for p in params]
    update = [p - c for p, c in zip(expected, current)]
    norm = np.sqrt(sum(float(np.sum(u ** 2)) for u in update))
    flwr_adapter.flower_clip_model_update(params, current, 0.5)
    for p, c, u in zip(params, current, update):
        np.testing.assert_allclose(p, c + u * min(1.0, 0.5 / norm), rtol=1e-12)
    assert np.sqrt(sum(float(np.sum((p - c) ** 2)) for p, c in zip(params, current))) == pytest.approx(0.5)
    assert flwr_adapter.flower_stdv(1.3, 0.5, 4) == pytest.approx(1.3 * 0.5 / 4)


def test_run_config_parsing_is_flowers():
    assert flwr_adapter.parse_run_config(["study='dfl-dp' seed=3 lr=0.5 dp=true"]) == {
        "study": "dfl-dp", "seed": 3, "lr": 0.5, "dp": True}
    assert flwr_adapter.parse_run_config(None) == {}


def test_task_identity_sets_a_dummy_one_and_restores_the_one_before():
    from flwr.supercore.task_identity import TaskIdentity  # the stock class, read to check the adapter

    # the autouse fixture (tests/conftest.py) already set (1, 1, 0) through the adapter with replace=True
    assert (TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id) == (1, 1, 0)
    TaskIdentity.node_id = 9
    with flwr_adapter.task_identity():  # an identity is set: kept
        assert TaskIdentity.node_id == 9
    with flwr_adapter.task_identity(replace=True):
        assert TaskIdentity.node_id == 0
        Message(RecordDict({}), dst_node_id=1, message_type="train")  # what it is for
    assert TaskIdentity.node_id == 9


def test_flower_logger_name_is_the_logger_flower_prints_through():
    import logging

    from flwr.common.logger import FLOWER_LOGGER  # the stock object, read to check the adapter

    assert logging.getLogger(flwr_adapter.flower_logger_name()) is FLOWER_LOGGER
