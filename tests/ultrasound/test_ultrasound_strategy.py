"""Flower's FedAvg / FedProx / FedAdam with the study's fixed cohort and buffer-safe FedAdam."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam

from strategies.ultrasound_fl import build_ultrasound_strategy, client_of, node_client_map

ARRAYS = ArrayRecord({"w": Array(np.array([1.0, 2.0], np.float32)),
                      "bn.running_var": Array(np.array([1.0], np.float32))})
UPDATES = {11: (np.array([2.0, 2.0]), 0.5, 10), 12: (np.array([0.0, 4.0]), 0.1, 30)}  # node: (w, running_var, n)


def _handler(node, msg):
    w, rv, n = UPDATES[node]
    arrays = ArrayRecord({"w": Array(w.astype(np.float32)), "bn.running_var": Array(np.array([rv], np.float32))})
    cid = client_of(msg.content["config"], node)
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": n, "client-id": cid})}),
                   reply_to=msg)


def _round(strategy, grid):
    msgs = list(strategy.configure_train(1, ARRAYS, ConfigRecord({"run-config": "{}"}), grid))
    return msgs, grid.send_and_receive(msgs)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "fedadam"])
def test_fixed_cohort_messages(fake_grid_cls, algorithm):
    grid = fake_grid_cls([12, 11, 13], _handler)  # one extra node beyond K = 2
    strategy = build_ultrasound_strategy(algorithm)
    strategy.set_cohort(node_client_map(grid.get_node_ids(), 2), "ultrasound")
    msgs, replies = _round(strategy, grid)
    assert sorted(m.metadata.dst_node_id for m in msgs) == [11, 12]
    assert {m.metadata.message_type for m in msgs} == {"train.ultrasound"}
    conf = msgs[0].content["config"]
    assert json.loads(conf["node-clients"]) == {"11": 0, "12": 1} and conf["server-round"] == 1
    assert ("proximal-mu" in conf) == (algorithm == "fedprox")
    if algorithm == "fedprox":
        assert conf["proximal-mu"] == pytest.approx(0.01)
    arrays, _ = strategy.aggregate_train(1, replies)
    assert {r["client-id"] for r in strategy.client_metrics[1]} == {0, 1}
    if algorithm != "fedadam":  # weighted mean: (10 * [2, 2] + 30 * [0, 4]) / 40
        np.testing.assert_allclose(arrays["w"].numpy(), [0.5, 3.5])


def test_fedadam_steps_parameters_but_averages_buffers(fake_grid_cls):
    grid = fake_grid_cls([11, 12], _handler)
    strategy = build_ultrasound_strategy("fedadam", server_lr=0.01, buffer_keys=["bn.running_var"])
    strategy.set_cohort(node_client_map([11, 12], 2), "ultrasound")
    _, replies = _round(strategy, grid)
    arrays, _ = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays["bn.running_var"].numpy(), [(10 * 0.5 + 30 * 0.1) / 40], rtol=1e-6)
    # parameters: exactly Flower's FedAdam step on the same replies
    ref = FedAdam(eta=0.01, beta_1=0.9, beta_2=0.99, fraction_evaluate=0.0)
    ref.current_arrays = {k: v.numpy() for k, v in ARRAYS.items()}
    ref_arrays, _ = ref.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays["w"].numpy(), ref_arrays["w"].numpy(), rtol=1e-6)
    assert not np.allclose(arrays["w"].numpy(), [0.5, 3.5])  # not the plain mean
    # plain FedAdam would move the running variance by an Adam step instead
    assert not np.allclose(ref_arrays["bn.running_var"].numpy(), arrays["bn.running_var"].numpy())


def test_a_failed_client_fails_the_round(fake_grid_cls):
    grid = fake_grid_cls([11, 12], _handler, fail_nodes={12})
    strategy = build_ultrasound_strategy("fedavg")
    strategy.set_cohort(node_client_map([11, 12], 2), "ultrasound")
    _, replies = _round(strategy, grid)
    with pytest.raises(RuntimeError, match="1/2 clients replied"):
        strategy.aggregate_train(1, replies)


def test_node_map_needs_k_nodes_and_clients_find_themselves():
    with pytest.raises(RuntimeError, match="K = 3"):
        node_client_map([5, 6], 3)
    conf = ConfigRecord({"node-clients": json.dumps({"5": 0, "9": 1})})
    assert client_of(conf, 9) == 1
    with pytest.raises(KeyError, match="node 7"):
        client_of(conf, 7)
    with pytest.raises(ValueError, match="allowed"):
        build_ultrasound_strategy("scaffold")
