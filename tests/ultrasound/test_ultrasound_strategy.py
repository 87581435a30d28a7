"""Flower's FedAvg / FedProx / FedAdam with the study's fixed cohort and buffer-safe FedAdam."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam

from flower_apps.ultrasound.strategy import build_ultrasound_strategy
from strategies.cohorts import client_ids_of


def client_of(config):
    (cid,) = client_ids_of(config)
    return cid

ARRAYS = ArrayRecord({"w": Array(np.array([1.0, 2.0], np.float32)),
                      "bn.running_var": Array(np.array([1.0], np.float32))})
UPDATES = {0: (np.array([2.0, 2.0]), 0.5, 10), 1: (np.array([0.0, 4.0]), 0.1, 30)}  # client: (w, running_var, n)


def _handler(node, msg):
    cid = client_of(msg.content["config"])
    w, rv, n = UPDATES[cid]
    arrays = ArrayRecord({"w": Array(w.astype(np.float32)), "bn.running_var": Array(np.array([rv], np.float32))})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": n, "client-id": cid,
                                                                          "client-ids": [cid]})}),
                   reply_to=msg)


def _round(strategy, grid):
    msgs = list(strategy.configure_train(1, ARRAYS, ConfigRecord({"run-config": "{}"}), grid))
    return msgs, grid.send_and_receive(msgs)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "fedadam"])
def test_fixed_cohort_messages(fake_grid_cls, algorithm):
    grid = fake_grid_cls([12, 11, 13], _handler)  # one extra node beyond K = 2
    strategy = build_ultrasound_strategy(algorithm)
    strategy.set_cohort(range(2), "ultrasound")
    msgs, replies = _round(strategy, grid)
    assert sorted(m.metadata.dst_node_id for m in msgs) == [11, 12]
    assert {m.metadata.message_type for m in msgs} == {"train.ultrasound"}
    assert {m.metadata.dst_node_id: client_of(m.content["config"]) for m in msgs} == {11: 0, 12: 1}
    conf = msgs[0].content["config"]
    assert conf["server-round"] == 1
    assert ("proximal-mu" in conf) == (algorithm == "fedprox")
    if algorithm == "fedprox":
        assert conf["proximal-mu"] == pytest.approx(0.01)
    arrays, _ = strategy.aggregate_train(1, replies)
    assert {r["client-id"] for r in strategy.client_metrics[1].values()} == {0, 1}
    if algorithm != "fedadam":  # weighted mean: (10 * [2, 2] + 30 * [0, 4]) / 40
        np.testing.assert_allclose(arrays["w"].numpy(), [0.5, 3.5])


def test_fedadam_steps_parameters_but_averages_buffers(fake_grid_cls):
    grid = fake_grid_cls([11, 12], _handler)
    strategy = build_ultrasound_strategy("fedadam", server_lr=0.01, buffer_keys=["bn.running_var"])
    strategy.set_cohort(range(2), "ultrasound")
    _, replies = _round(strategy, grid)
    arrays, _ = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays["bn.running_var"].numpy(), [(10 * 0.5 + 30 * 0.1) / 40], rtol=1e-6)
    # parameters: exactly Flower's FedAdam step on the same replies
    ref = FedAdam(eta=0.01, beta_1=0.9, beta_2=0.99, fraction_evaluate=0.0)
    ref.current_arrays = {k: v.numpy() for k, v in ARRAYS.items()}
    ref_arrays, _ = ref.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays["w"].numpy(), ref_arrays["w"].numpy(), rtol=1e-6)
    assert not np.allclose(arrays["w"].numpy(), [0.5, 3.5])  # not the plain mean
    # Flower's step comes out in float64 (numpy 2 promotion); the global model stays in the dtype it was sent in,
    # rounded once from Flower's value
    assert ref_arrays["w"].numpy().dtype == np.float64
    assert {k: a.numpy().dtype for k, a in arrays.items()} == {k: a.numpy().dtype for k, a in ARRAYS.items()}
    np.testing.assert_array_equal(arrays["w"].numpy(), ref_arrays["w"].numpy().astype(np.float32))
    # plain FedAdam would move the running variance by an Adam step instead
    assert not np.allclose(ref_arrays["bn.running_var"].numpy(), arrays["bn.running_var"].numpy())


def test_a_failed_client_fails_the_round(fake_grid_cls):
    grid = fake_grid_cls([11, 12], _handler, fail_nodes={12})
    strategy = build_ultrasound_strategy("fedavg")
    strategy.set_cohort(range(2), "ultrasound")
    _, replies = _round(strategy, grid)
    with pytest.raises(RuntimeError, match="1/2 clients replied; client 1: error reply"):
        strategy.aggregate_train(1, replies)


def test_fewer_nodes_than_clients_share_them_with_the_same_result(fake_grid_cls):
    """K = 2 logical clients on one SuperNode (a laptop's default local federation): two messages to that
    node, the same aggregate as with one node per client."""
    out = []
    for nodes in ([11, 12], [11]):
        grid = fake_grid_cls(nodes, _handler)
        strategy = build_ultrasound_strategy("fedavg")
        strategy.set_cohort(range(2), "ultrasound")
        msgs, replies = _round(strategy, grid)
        assert len(msgs) == 2 and {m.metadata.dst_node_id for m in msgs} == set(nodes)
        arrays, _ = strategy.aggregate_train(1, replies)
        assert sorted(r["client-id"] for r in strategy.client_metrics[1].values()) == [0, 1]
        out.append(arrays["w"].numpy())
    np.testing.assert_allclose(out[0], out[1])


def test_clients_find_themselves_in_the_message():
    assert client_of(ConfigRecord({"client-ids": [3]})) == 3
    with pytest.raises(KeyError, match="client-ids"):
        client_of(ConfigRecord({}))
    with pytest.raises(ValueError, match="allowed"):
        build_ultrasound_strategy("scaffold")


def test_a_reply_speaking_for_another_client_is_left_out_and_recorded(fake_grid_cls):
    def liar(node, msg):
        reply = _handler(node, msg)
        if node == 12:  # client 1's node says it is client 0
            reply.content["metrics"]["client-ids"] = [0]
        return reply

    grid = fake_grid_cls([11, 12], liar)
    strategy = build_ultrasound_strategy("fedavg")
    strategy.set_cohort(range(2), "ultrasound")
    _, replies = _round(strategy, grid)
    arrays, _ = strategy.aggregate_train(1, replies)
    # hostile content, not a lost client: the round is client 0's alone and the refusal is on record
    np.testing.assert_allclose(arrays["w"].numpy(), [2.0, 2.0])
    assert "reply from node 12 rejected" in strategy.problems[1][1]


def test_a_client_that_does_not_answer_fails_the_round(fake_grid_cls):
    grid = fake_grid_cls([11, 12], _handler, silent_nodes={12})
    strategy = build_ultrasound_strategy("fedavg")
    strategy.set_cohort(range(2), "ultrasound")
    _, replies = _round(strategy, grid)
    with pytest.raises(RuntimeError, match="1/2 clients replied; client 1"):
        strategy.aggregate_train(1, replies)
