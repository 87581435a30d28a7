"""The model's trip through a relay hop: ArrayRecord serialization (same bytes and the same chain
result as Flower's own conversions) and the transport's poll schedule (on a fake clock)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

import strategies.transport as transport
from flower_apps.common.torch_utils import array_to_ndarray, ndarray_to_array, record_to_state, state_to_record
from strategies.records import client_key
from strategies.sequential import SequentialDFL

ARRAYS = {
    "float32 2x3": np.arange(6, dtype=np.float32).reshape(2, 3),
    "0-d int64 (num_batches_tracked)": np.array(7, dtype=np.int64),
    "empty": np.zeros((0, 3), dtype=np.float64),
    "bool": np.array([True, False, True]),
    "float16": np.array([1.5, -2.25], dtype=np.float16),
    "strided view": np.arange(24, dtype=np.uint8).reshape(2, 3, 4)[:, ::2],
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_array_bytes_are_flowers(name):
    a = ARRAYS[name]
    ours, flowers = ndarray_to_array(a), Array(a)
    assert (ours.dtype, ours.shape, ours.stype) == (flowers.dtype, flowers.shape, flowers.stype)
    assert ours.data == flowers.data  # byte for byte what np.save writes
    back = array_to_ndarray(flowers)
    assert back.dtype == a.dtype and back.shape == a.shape and np.array_equal(back, a)


def test_fortran_ordered_arrays_round_trip_both_ways():
    a = np.arange(12, dtype=np.int64).reshape(3, 4).T  # np.save writes these in Fortran order
    np.testing.assert_array_equal(array_to_ndarray(Array(a)), a)  # Flower's bytes, our reader
    np.testing.assert_array_equal(ndarray_to_array(a).numpy(), a)  # our bytes, Flower's reader


def test_decoded_tensors_own_their_memory():
    rec = ArrayRecord(OrderedDict(w=Array(np.ones((2, 3), dtype=np.float32))))
    state = record_to_state(rec)
    state["w"].add_(1.0)  # in place, as load_state_dict(assign=True) + an optimizer would
    np.testing.assert_array_equal(rec["w"].numpy(), 1.0)
    assert state["w"].numpy().flags.writeable


def test_other_serializations_keep_flowers_error():
    arr = Array(dtype="float32", shape=(1,), stype="torch.raw", data=b"\x00" * 4)
    with pytest.raises(TypeError, match="Unsupported serialization type"):
        array_to_ndarray(arr)


def test_object_arrays_refused():
    with pytest.raises(ValueError, match="object arrays"):
        ndarray_to_array(np.array([{"a": 1}], dtype=object))


def _flowers_to_record(model: torch.nn.Module) -> ArrayRecord:  # the conversions before this module's own
    return ArrayRecord(OrderedDict((k, Array(v.detach().cpu().numpy())) for k, v in model.state_dict().items()))


def _flowers_to_state(record: ArrayRecord) -> OrderedDict:
    return OrderedDict((k, torch.from_numpy(np.array(v.numpy(), copy=True))) for k, v in record.items())


def _chain_final_bytes(fake_grid_cls, to_record, to_state) -> dict[str, bytes]:
    """Two rounds of a 3-client chain; each hop decodes the token, takes 2 seeded SGD steps, encodes."""

    def handler(node: int, msg: Message) -> Message:
        cid = int(msg.content["config"]["client-ids"][0])
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
        model.load_state_dict(to_state(msg.content["arrays"]))
        g = torch.Generator().manual_seed(100 + cid)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            x, y = torch.randn(8, 3, generator=g), torch.randint(0, 2, (8,), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        out = RecordDict({client_key(cid): to_record(model), "metrics": MetricRecord(
            {"num-examples": 8, "train-loss": 1.0, "client-ids": [cid]})})
        return Message(out, reply_to=msg)

    torch.manual_seed(0)
    init = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    strategy = SequentialDFL([0, 1, 2], "x")
    result = strategy.start(fake_grid_cls([7, 8, 9], handler), to_record(init), num_rounds=2,
                            train_config=ConfigRecord({"run-config": "{}"}))
    return {k: v.numpy().tobytes() for k, v in result.arrays.items()}


def test_tiny_chain_gives_the_same_model_bytes_as_flowers_conversions(fake_grid_cls):
    ours = _chain_final_bytes(fake_grid_cls, state_to_record, record_to_state)
    before = _chain_final_bytes(fake_grid_cls, _flowers_to_record, _flowers_to_state)
    assert list(ours) == list(before) and "1.num_batches_tracked" in ours
    assert ours == before


class FakeClock:
    """Stands in for the ``time`` module inside strategies.transport: sleeps only advance the clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


class SlowGrid:
    """Answers the one pushed message on pull ``answer_on``; each pull costs ``pull_cost`` clock seconds."""

    def __init__(self, clock: FakeClock, pull_cost: float, answer_on: int | None) -> None:
        self.clock, self.pull_cost, self.answer_on, self.pulls = clock, pull_cost, answer_on, 0

    def push_messages(self, messages):
        return ["m1"]

    def pull_messages(self, ids):
        self.pulls += 1
        self.clock.now += self.pull_cost
        if self.pulls == self.answer_on:
            reply = Message(RecordDict(), dst_node_id=1, message_type="train")
            reply.metadata.__dict__["_reply_to_message_id"] = "m1"
            return [reply]
        return []


@pytest.mark.parametrize("pull_cost, cap", [(1e-4, 2e-3), (5e-3, 0.02)])
def test_poll_interval_grows_to_the_cost_cap(monkeypatch, pull_cost, cap):
    clock = FakeClock()
    monkeypatch.setattr(transport, "time", clock)
    grid = SlowGrid(clock, pull_cost, answer_on=40)
    replies = transport.send_and_receive(grid, [object()], min_poll=5e-4, max_poll=0.02, poll_budget=0.05)
    assert len(replies) == 1 and grid.pulls == 40
    s = clock.sleeps
    assert s[0] == 5e-4 and max(s) == pytest.approx(cap)  # cap = pull cost / budget, within [min, max]
    assert all(b == pytest.approx(min(a * 1.5, cap)) for a, b in zip(s, s[1:]))  # geometric, then flat


def test_poll_honours_timeout_and_refuses_bad_budget(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(transport, "time", clock)
    assert transport.send_and_receive(SlowGrid(clock, 1e-4, answer_on=None), [object()], timeout=0.5) == []
    assert 0.5 <= clock.now < 0.5 + 0.02 + 1e-3  # stops within one capped interval of the deadline
    with pytest.raises(ValueError, match="poll_budget"):
        transport.send_and_receive(SlowGrid(clock, 1e-4, 1), [object()], poll_budget=0)
