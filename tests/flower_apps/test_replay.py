"""flower_apps/common/replay.py: a recorded run's client updates replayed under the real server code (issue 37).

The replay of the correct mechanism with the same seeds must reproduce the recorded run's audit exactly;
a broken mechanism replayed on the same updates must be flagged; a different plan is refused.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from flower_apps.common.replay import RecordingGrid, ReplayGrid
from strategies.records import from_numpy, to_numpy


def _train_msg(node: int, model: dict) -> Message:
    return Message(RecordDict({"arrays": from_numpy(OrderedDict(model)), "config": ConfigRecord({"x": 1})}),
                   dst_node_id=node, message_type="train.x")


def test_replay_moves_each_model_shaped_record_by_the_recorded_update(fake_grid_cls):
    def handler(node, m):  # a client adding its node id to every float weight, and an int counter it keeps
        w = to_numpy(m.content["arrays"])
        upd = OrderedDict((k, v + node if v.dtype.kind == "f" else v * 0 + 7) for k, v in w.items())
        return Message(RecordDict({"client-3": from_numpy(upd), "other": from_numpy({"z": np.ones(2)})}), reply_to=m)

    real = fake_grid_cls([1, 2], handler)
    rec = RecordingGrid(real)
    model = {"w": np.arange(4, dtype=np.float32), "n": np.array([1], dtype=np.int64)}
    got = rec.send_and_receive([_train_msg(1, model), _train_msg(2, model)])
    assert len(got) == 2 and len(rec.exchanges) == 2 and rec.get_node_ids() == [1, 2]  # delegated

    replay = ReplayGrid(rec.exchanges, [1, 2])
    moved = {"w": np.arange(4, dtype=np.float32) * 10, "n": np.array([5], dtype=np.int64)}
    out = replay.send_and_receive([_train_msg(1, moved), _train_msg(2, moved)])
    assert replay.finished
    by_dst = dict(enumerate(out))  # FakeGrid answers in push order
    for i, node in enumerate((1, 2)):
        arrays = to_numpy(by_dst[i].content["client-3"])
        np.testing.assert_array_equal(arrays["w"], moved["w"] + node)  # the recorded update on today's model
        assert arrays["n"].tolist() == [7]  # non-float arrays as recorded
        assert to_numpy(by_dst[i].content["other"])["z"].tolist() == [1.0, 1.0]  # not model-shaped: as recorded
    with pytest.raises(RuntimeError, match="never sent in the recorded run"):
        replay.push_messages([_train_msg(1, moved)])
    other = ReplayGrid(rec.exchanges, [1, 2])
    with pytest.raises(RuntimeError, match="not the recorded run's plan"):
        other.push_messages([_train_msg(2, moved)])


@pytest.mark.slow
def test_sequential_dfl_replay_reproduces_the_recorded_audit_and_flags_a_fault(monkeypatch):
    from flower_apps.dfl_dp.audit_trial import audit_replays
    from privacy.faults import ALLOW_ENV

    monkeypatch.setenv(ALLOW_ENV, "1")
    recorded, same, broken = audit_replays(3, ["", "noise-div-2"], "smoke", "sequential-dfl", num_rounds=2)
    assert not recorded["trial"]["replayed"] and same["trial"]["replayed"] and broken["trial"]["replayed"]
    strip = lambda a: {k: v for k, v in a.items() if k != "trial"}
    assert strip(same) == strip(recorded)  # same seeds, same updates: the same releases, bit for bit
    assert recorded["verdict"] == "consistent" and broken["verdict"] == "violation"
    assert "measured-noise" in broken["verdict_detail"]["fired"]
