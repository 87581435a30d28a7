"""Flower's message types: each study's ClientApp answers the types it registers and only those,
and a reply of another type than the message it answers is refused on the server.

``train.<action>`` trains and returns models, ``evaluate.<action>`` scores the received model,
``query.<action>`` reports something and trains nothing (flower_apps/router.py, strategies/cohorts.py).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_apps.common.node_data import DESCRIBE, QUERY, discover
from flower_apps.router import client_app as root_app
from flower_apps.router import register_handlers
from flower_apps.studies import BUILTIN_STUDIES, STUDIES
from strategies.cohorts import build_messages, check_replies, plan_cohorts
from strategies.fedavg_equal import EqualWeightFedAvg
from strategies.records import client_key, from_numpy, to_numpy

KINDS = ("train", "evaluate", "query")
FIELD = {"train": "client_train", "evaluate": "client_evaluate", "query": "client_query"}
# What each built-in study sends: tabular-pdp evaluates on its clients' test splits and asks the anonymize /
# harmonize queries; the others evaluate on the coordinator and ask only the node-local describe query.
SENT = {"dfl-dp": {"train", "query"}, "tabular-pdp": {"train", "evaluate", "query"},
        "ultrasound": {"train", "query"}, "unlinkable-dfl": {"train", "query"}}
CTX = Context(1, 1, {}, RecordDict(), {})


def _message(kind: str, action: str, config: dict | None = None) -> Message:
    return Message(RecordDict({"config": ConfigRecord(config or {})}), message_type=f"{kind}.{action}", dst_node_id=1)


def test_every_builtin_study_registers_a_handler_for_each_type_it_sends():
    assert sorted(BUILTIN_STUDIES) == sorted(SENT)
    for name, kinds in SENT.items():
        spec = STUDIES[name]
        assert set(spec.handlers()) == kinds, name
        for kind in kinds:  # the client_app module's own function of that name
            fn = spec.handlers()[kind]
            assert fn.__name__ == kind and fn.__module__.endswith(".client_app"), (name, kind, fn)


@pytest.mark.parametrize("name", sorted(SENT))
def test_each_type_reaches_its_handler_and_an_unregistered_type_is_refused(name):
    spec = STUDIES[name]
    seen: list[tuple[str, str]] = []

    def recorder(kind):
        def handle(msg: Message, context: Context) -> Message:
            seen.append((kind, msg.metadata.message_type))
            return Message(RecordDict(), reply_to=msg)
        return handle

    app = ClientApp()
    register_handlers(app, dataclasses.replace(spec, **{FIELD[k]: recorder(k) for k in spec.handlers()}))
    for kind in KINDS:
        msg = _message(kind, spec.action)
        if kind in SENT[name]:
            assert app(msg, CTX).metadata.message_type == f"{kind}.{spec.action}"
            assert seen[-1] == (kind, f"{kind}.{spec.action}")  # its own handler, no other
        else:
            with pytest.raises(ValueError, match=f"No {kind} function registered with name '{spec.action}'"):
                app(msg, CTX)
    assert [k for k, _ in seen] == [k for k in KINDS if k in SENT[name]]


@pytest.mark.parametrize("name", sorted(n for n in SENT if "evaluate" not in SENT[n]))
def test_the_root_client_app_refuses_an_evaluate_message_of_a_study_without_one(name):
    with pytest.raises(ValueError, match=f"No evaluate function registered with name '{STUDIES[name].action}'"):
        root_app(_message("evaluate", STUDIES[name].action), CTX)


@pytest.mark.parametrize("name", sorted(SENT))
def test_a_query_handler_refuses_a_query_it_does_not_answer(name):
    spec = STUDIES[name]
    allowed = "'anonymize', 'describe-node-data', 'harmonize'" if name == "tabular-pdp" else "'describe-node-data'"
    for config in ({QUERY: "statistics"}, {}):  # an unknown query, and a query message that names none
        with pytest.raises(ValueError, match=f"allowed: \\[{allowed}\\]"):
            root_app(_message("query", spec.action, {**config, "run-config": "{}", "client-ids": [0]}), CTX)


# --- the server refuses a reply of another type than its message

def _pushed(fake_grid_cls, kind="train"):
    grid = fake_grid_cls([1, 2], lambda n, m: Message(RecordDict(), reply_to=m))
    msgs = build_messages(plan_cohorts([0, 1], [1, 2], 1), from_numpy({"w": np.zeros(2, np.float32)}),
                          ConfigRecord(), "x", kind)
    grid.push_messages(msgs)
    return msgs


def _reply(msg: Message, value: float, as_type: str | None = None) -> Message:
    cid = int(msg.content["config"]["client-ids"][0])
    reply = Message(RecordDict({client_key(cid): from_numpy({"w": np.full(2, value, np.float32)}),
                                "metrics": MetricRecord({"num-examples": 5, "train-loss": 1.0, "client-ids": [cid]})}),
                    reply_to=msg)
    if as_type is not None:
        reply.metadata.message_type = as_type  # what a hostile client can do: the setter is public
    return reply


def test_check_replies_refuses_a_reply_of_another_type(fake_grid_cls):
    sent = _pushed(fake_grid_cls)
    assert sent[0].metadata.message_type == "train.x"
    checked = check_replies(sent, [_reply(sent[0], 1.0), _reply(sent[1], 2.0, as_type="evaluate.x")])
    assert checked.contributors == [0] and checked.rejected_clients == {1}
    assert "of type 'evaluate.x', answering a 'train.x' message" in checked.problem_of[1]
    # the same replies with their own type are both valid
    sent = _pushed(fake_grid_cls)
    assert check_replies(sent, [_reply(sent[0], 1.0), _reply(sent[1], 2.0)]).contributors == [0, 1]
    # an evaluate message wants an evaluate reply: a train-typed answer is refused too
    sent = _pushed(fake_grid_cls, "evaluate")
    checked = check_replies(sent, [_reply(sent[0], 1.0, as_type="train.x")], array_claims="each")
    assert checked.contributors == [] and "answering a 'evaluate.x' message" in checked.problem_of[0]


def test_an_error_reply_counts_as_failed_whatever_its_type(fake_grid_cls):
    sent = _pushed(fake_grid_cls)
    err = Message(Error(3, "Node unavailable"), reply_to=sent[0])
    err.metadata.message_type = "system"  # as the SuperLink answers an expired message
    checked = check_replies(sent, [err])
    assert checked.failed == [err] and checked.problem_of[0] == "error reply: Node unavailable"
    assert not checked.rejected


def test_a_wrong_typed_reply_never_enters_the_aggregate(fake_grid_cls):
    def handler(node: int, msg: Message) -> Message:
        cid = int(msg.content["config"]["client-ids"][0])
        return _reply(msg, 10.0 * (cid + 1), as_type="query.x" if cid == 1 else None)

    strategy = EqualWeightFedAvg([0, 1], "x")
    grid = fake_grid_cls([1, 2], handler)
    msgs = list(strategy.configure_train(1, from_numpy(OrderedDict(w=np.zeros(2, np.float32))), ConfigRecord(), grid))
    arrays, metrics = strategy.aggregate_train(1, grid.send_and_receive(msgs))
    np.testing.assert_array_equal(to_numpy(arrays)["w"], np.full(2, 10.0, np.float32))  # client 0's model alone
    assert metrics["num-contributors"] == 1
    assert "of type 'query.x'" in strategy.problems[1][1]


def test_discovery_refuses_a_describe_reply_of_another_type(fake_grid_cls):
    def handler(node: int, msg: Message) -> Message:
        assert msg.metadata.message_type == "query.x" and msg.content["config"][QUERY] == DESCRIBE
        reply = Message(RecordDict({"node-data": ConfigRecord({"node": f"site-{node}", "client-ids": [node - 1],
                                                               "sizes": [4]})}), reply_to=msg)
        if node == 2:
            reply.metadata.message_type = "train.x"
        return reply

    found = discover(fake_grid_cls([1, 2], handler), "x", ConfigRecord(), 5.0, 2)
    assert found.placement == {0: 1}
    assert found.errors == {2: "node 2: a 'train.x' reply to the 'query.x' describe query"}
