"""Record a run's client replies once; replay the server's mechanism on them (issue 37's detection benchmark).

Issue 37 allows the audit's statistical benchmark to "replay the mechanism on recorded client updates
rather than retrain, if the canaries still pass through the real code". This module does that at the
level of Flower's ``Grid``, so that everything on the server runs as in a real run: the study's
``server_main``, its strategy stack (clipping, the DP wrapper and its fault, the canary insertion),
the reply checks, the auditor and its verdict.

* :class:`RecordingGrid` wraps the grid of a real run and keeps, for every message the server pushes,
  its destination, type and model (the message's one ArrayRecord), and the reply's content.
* :class:`ReplayGrid` answers the same sequence of messages without clients: reply i is the recorded
  reply i with every model-shaped ArrayRecord moved by the same *update* the client made in the
  recorded run: ``recorded_reply - recorded_sent + sent_now``. Replaying the correct mechanism with the
  same seeds therefore reproduces the recorded run exactly (tested); a broken mechanism sees the
  updates the clients made on the correct trajectory, applied to its own.

What a replay does not do: retrain. The clients' updates are those of the recorded trajectory, so a
replayed run's accuracy means nothing (its summary says ``replayed``); the audit reads only the
released models, which the replayed mechanism produces. A replay refuses a message sequence that
differs from the recorded one (another plan, another number of rounds).
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, Message, RecordDict

from strategies.records import from_numpy, to_numpy


@dataclass
class Exchange:
    """One pushed message and its reply, as recorded."""

    dst: int
    message_type: str
    sent: OrderedDict | None  # the message's model (its one ArrayRecord), None when it carries none
    reply: RecordDict | None  # None: no reply arrived (or an error reply, kept as None content)
    error: bool = False


def _model_of(content: RecordDict) -> OrderedDict | None:
    recs = list(content.array_records.values())
    return to_numpy(recs[0]) if len(recs) == 1 else None


class RecordingGrid:
    """A Grid that delegates to ``grid`` and records every exchange, in push order."""

    def __init__(self, grid) -> None:
        self._grid = grid
        self.exchanges: list[Exchange] = []
        self._index: dict[str, int] = {}

    def __getattr__(self, name):  # everything else (get_node_ids, create_message, ...) is the real grid's
        return getattr(self._grid, name)

    def push_messages(self, messages):
        messages = list(messages)
        ids = list(self._grid.push_messages(messages))
        for m, mid in zip(messages, ids):
            self._index[mid] = len(self.exchanges)
            self.exchanges.append(Exchange(m.metadata.dst_node_id, m.metadata.message_type, _model_of(m.content), None))
        return ids

    def pull_messages(self, message_ids):
        got = list(self._grid.pull_messages(message_ids))
        for r in got:
            ex = self.exchanges[self._index[r.metadata.reply_to_message_id]]
            if r.has_error():
                ex.error = True
            else:
                ex.reply = r.content
        return got

    def send_and_receive(self, messages, *, timeout=None):
        from strategies.transport import send_and_receive

        return send_and_receive(self, messages, timeout=timeout)


def _shifted(reply: RecordDict, recorded_sent: OrderedDict | None, sent_now: OrderedDict | None) -> RecordDict:
    """``reply`` with each model-shaped ArrayRecord moved by ``sent_now - recorded_sent`` (float arrays only)."""
    if recorded_sent is None or sent_now is None:
        return reply
    shapes = {k: (v.shape, v.dtype) for k, v in recorded_sent.items()}
    out = RecordDict()
    for name, rec in reply.items():
        if isinstance(rec, ArrayRecord):
            arrays = to_numpy(rec)
            if {k: (v.shape, v.dtype) for k, v in arrays.items()} == shapes:
                rec = from_numpy(OrderedDict(
                    (k, (v.astype(np.float64) - recorded_sent[k] + sent_now[k]).astype(v.dtype))
                    if np.issubdtype(v.dtype, np.floating) else (k, v) for k, v in arrays.items()))
        out[name] = rec
    return out


class ReplayGrid:
    """A Grid without clients that answers the recorded exchanges in order (see the module doc)."""

    def __init__(self, exchanges: list[Exchange], node_ids: list[int]) -> None:
        self.exchanges = exchanges
        self.node_ids = list(node_ids)
        self._next = 0
        self._replies: dict[str, Message] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)

    def push_messages(self, messages):
        from flwr.app import Error

        ids = []
        for m in messages:
            if self._next >= len(self.exchanges):
                raise RuntimeError(f"replay: message {self._next + 1} was never sent in the recorded run "
                                   f"({len(self.exchanges)} were)")
            ex = self.exchanges[self._next]
            if (m.metadata.dst_node_id, m.metadata.message_type) != (ex.dst, ex.message_type):
                raise RuntimeError(f"replay: message {self._next} goes to node {m.metadata.dst_node_id} "
                                   f"({m.metadata.message_type}); the recorded one went to {ex.dst} "
                                   f"({ex.message_type}): not the recorded run's plan")
            self._next += 1
            mid = str(uuid.uuid4())
            m.metadata.__dict__["_message_id"] = mid
            ids.append(mid)
            if ex.error:
                self._replies[mid] = Message(Error(code=1, reason="recorded run: this message failed"), reply_to=m)
            elif ex.reply is not None:
                self._replies[mid] = Message(_shifted(ex.reply, ex.sent, _model_of(m.content)), reply_to=m)
        return ids

    def pull_messages(self, message_ids):
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(messages))

    @property
    def finished(self) -> bool:
        """Whether every recorded message was sent again."""
        return self._next == len(self.exchanges)
