"""Which node plays which logical clients, and how messages are built for them.

The one addressing module: :func:`plan_cohorts` says which node each message goes to (round-robin over
the connected SuperNodes in a simulation; with node-local data, the node that holds the clients, from
the explicit ``placement`` the describe round found, flower_apps.common.node_data), and
:func:`build_messages` builds one message per planned (node, clients) entry, of Flower's message type
for what it asks: ``train.<action>`` (train and return a model), ``evaluate.<action>`` (score the
received model), ``query.<action>`` (report something; trains nothing). A reply must carry the type of
the message it answers (:func:`check_replies`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from strategies.layer import Layer, layers
from strategies.records import int_list, number
from strategies.reply_rules import DEFAULT_RULES, ReplyRules, reply_problem

_log = logging.getLogger(__name__)


def plan_cohorts(client_ids: list[int], node_ids: list[int], clients_per_message: int,
                 placement: Mapping[int, int] | None = None) -> list[tuple[int, list[int]]]:
    """Pack logical clients, in order, into messages of at most ``clients_per_message`` clients.

    Without ``placement`` (a simulation: any node can play any client) message j goes to node
    ``node_ids[j % len(node_ids)]`` (sorted ids, so the mapping is reproducible). With one client per
    message and as many nodes as clients, every logical client is its own SuperNode, as in the paper;
    packing several clients into one message is a transport optimisation (fewer messages) that leaves
    the math unchanged.

    ``placement`` (logical client -> the node that holds its data, node-local deployments): each message
    goes to the node holding its clients; a message holds consecutive clients of one node only (a new
    message starts where the holder changes), so the client order, a sequential chain's included, is the
    same as without placement. ``node_ids`` is then not used; a client no node holds is refused.
    """
    if clients_per_message < 1:
        raise ValueError(f"clients_per_message must be >= 1, got {clients_per_message}")
    if placement is not None:
        unplaced = [c for c in client_ids if c not in placement]
        if unplaced:
            raise ValueError(f"no node holds client(s) {unplaced} (placement from the describe round)")
        plan: list[tuple[int, list[int]]] = []
        for c in client_ids:
            node = int(placement[c])
            if plan and plan[-1][0] == node and len(plan[-1][1]) < clients_per_message:
                plan[-1][1].append(c)
            else:
                plan.append((node, [c]))
        return plan
    if not node_ids:
        raise ValueError("no SuperNodes are connected")
    nodes = sorted(node_ids)
    chunks = [client_ids[i : i + clients_per_message] for i in range(0, len(client_ids), clients_per_message)]
    return [(nodes[j % len(nodes)], chunk) for j, chunk in enumerate(chunks)]


def wait_for_nodes(grid: Grid, minimum: int, timeout: float = 120.0) -> list[int]:
    """Node ids once at least ``minimum`` are connected (deployments connect gradually)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= minimum or time.monotonic() > deadline:
            if len(nodes) < minimum:
                raise RuntimeError(f"only {len(nodes)} SuperNodes connected after {timeout:.0f}s, need {minimum}")
            return nodes
        time.sleep(0.5)


MESSAGE_TYPES = (MessageType.TRAIN, MessageType.EVALUATE, MessageType.QUERY)


def build_messages(
    plan: list[tuple[int, list[int]]], arrays: ArrayRecord, config: ConfigRecord, action: str,
    kind: str = MessageType.TRAIN, arrays_key: str = "arrays", config_key: str = "config",
) -> list[Message]:
    """One ``<kind>.<action>`` message per (node, clients) entry, all carrying ``arrays`` and ``config``.

    ``kind`` is Flower's message type: ``train`` (the default), ``evaluate`` or ``query``. The config
    of each message gets ``client-ids``: the logical clients that node is asked to play, in order.
    This is the one way the studies address a logical client.
    """
    if kind not in MESSAGE_TYPES:
        raise ValueError(f"kind must be one of {MESSAGE_TYPES}, got {kind!r}")
    messages = []
    for node_id, clients in plan:
        cfg = ConfigRecord(dict(config))
        cfg["client-ids"] = list(clients)
        messages.append(
            Message(
                content=RecordDict({arrays_key: arrays, config_key: cfg}),
                message_type=f"{kind}.{action}",
                dst_node_id=node_id,
            )
        )
    return messages


def config_record(run_config: dict) -> ConfigRecord:
    """The study's resolved config, serialized once for every message."""
    return ConfigRecord({"run-config": json.dumps(run_config, sort_keys=True)})


# --- Replies are checked against the plan: the cohort is what the server asked, never what a reply says.

REJECTED_REPLY = 901  # Error code of a reply the server refused (see check_replies)
ARRAY_CLAIMS = ("each", "last", "none")


def client_ids_of(config: ConfigRecord) -> list[int]:
    """The logical clients a received message asks its node to play (ClientApp side)."""
    if "client-ids" not in config:
        raise KeyError("message without 'client-ids' in its config: it was not built by strategies.cohorts")
    return [int(c) for c in int_list(config["client-ids"])]


def planned_clients(message: Message) -> tuple[int, ...]:
    """The logical clients a message the server built asks for (its config's ``client-ids``)."""
    for rec in message.content.config_records.values():
        if "client-ids" in rec:
            return tuple(int(c) for c in int_list(rec["client-ids"]))
    raise KeyError("message without client-ids in its config: it was not built from a plan")


def _claims_problem(planned: tuple[int, ...], reply: Message, array_claims: str) -> str | None:
    """Why ``reply`` does not speak for exactly ``planned`` (None when it does)."""
    from strategies.records import CLIENT_PREFIX

    content = reply.content
    keyed = []
    for key in content.array_records:
        if key.startswith(CLIENT_PREFIX):
            try:
                keyed.append(int(key[len(CLIENT_PREFIX):]))
            except ValueError:
                return f"malformed record key {key!r}"
    expected = {"each": sorted(planned), "last": [planned[-1]], "none": []}[array_claims]
    if sorted(keyed) != expected:
        return f"models for clients {sorted(keyed)}, asked for {expected}"
    if "metrics" in content.metric_records and "client-ids" in content.metric_records["metrics"]:
        listed = [int(c) for c in int_list(content.metric_records["metrics"]["client-ids"])]
        if listed != list(planned):
            return f"claims to have trained clients {listed}, asked for {list(planned)}"
    if "info" in content.config_records and "client-id" in content.config_records["info"]:
        cid = int(number(content.config_records["info"]["client-id"]))
        if (cid,) != planned:
            return f"speaks for client {cid}, asked for {list(planned)}"
    return None


@dataclass
class CheckedReplies:
    """A round's replies after :func:`check_replies`.

    ``valid`` speak for exactly the clients their message asked for; ``failed`` are error
    replies, including the ``rejected`` ones turned into errors so that any strategy counts
    them as failures; ``contributors`` are the planned clients of the valid replies.
    ``reply_of`` maps each contributor to its (valid) reply, ``problem_of`` every other planned
    client to why it has none; both come from the plan, never from what a reply says.
    """

    valid: list[Message] = field(default_factory=list)
    failed: list[Message] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    contributors: list[int] = field(default_factory=list)
    reply_of: dict[int, Message] = field(default_factory=dict)
    problem_of: dict[int, str] = field(default_factory=dict)
    answer_of: dict[int, Message] = field(default_factory=dict)  # valid, error or rejected-as-error reply
    rejected_clients: set[int] = field(default_factory=set)  # planned clients whose reply was refused

    @property
    def replies(self) -> list[Message]:
        """Valid replies followed by error replies (what a wrapped strategy should see)."""
        return self.valid + self.failed

    def valid_by_client(self) -> list[Message]:
        """Valid replies ordered by their first planned client (arrival order must not matter)."""
        first = {id(r): c for c, r in sorted(self.reply_of.items(), reverse=True)}
        return sorted(self.valid, key=lambda r: first[id(r)])


def check_replies(sent: Iterable[Message], replies: Iterable[Message], array_claims: str = "each",
                  rules: ReplyRules = DEFAULT_RULES) -> CheckedReplies:
    """Match replies to the messages they answer and refuse those that speak for other clients.

    Threat: a participant that inflates the cohort (a reply carrying models or ``client-ids``
    of clients it was not asked to play, or a second reply to one message) would make a DP
    wrapper size its noise for more clients than contributed. Here a reply is valid only if it
    answers a message of this round (``reply_to_message_id``, set by Flower, not by the
    client), is the first answer to it, has that message's type when it carries content (an
    ``evaluate`` or ``query`` answer to a ``train`` message is refused, and any other mismatch;
    an error reply carries no content and counts as failed whatever its type: the SuperLink
    answers an expired message with a ``system`` one), and claims exactly the message's planned
    clients.

    Parameters
    ----------
    sent : the messages of the round, after they were pushed (Flower set their ids).
    replies : what came back.
    array_claims : "each" (one ``client.<id>`` model per planned client), "last" (a chain
        reply: one token under the last planned client) or "none" (models under other keys).
    rules : what the content must satisfy (strategies.reply_rules): every model shaped like the
        arrays the message sent, finite, metrics in range. A reply that fails is rejected like one
        that speaks for other clients: counted as failed, its reason kept, never aggregated.
    """
    if array_claims not in ARRAY_CLAIMS:
        raise ValueError(f"array_claims must be one of {ARRAY_CLAIMS}, got {array_claims!r}")
    sent = list(sent)
    by_id = {m.metadata.message_id: m for m in sent}
    if "" in by_id:
        raise ValueError("check_replies needs messages that were pushed (their message_id is empty)")
    out = CheckedReplies()
    answered: set[str] = set()
    for reply in replies:
        mid = reply.metadata.reply_to_message_id
        msg = by_id.get(mid)
        if msg is None:
            out.rejected.append(f"reply from node {reply.metadata.src_node_id} to a message this round did not send")
            continue  # nothing to attribute it to
        if mid in answered:
            out.rejected.append(f"second reply to the message for clients {list(planned_clients(msg))}")
            continue
        answered.add(mid)
        planned = planned_clients(msg)
        if reply.has_error():
            out.failed.append(reply)
            out.problem_of.update({c: f"error reply: {reply.error.reason}" for c in planned})
            out.answer_of.update({c: reply for c in planned})
            continue
        problem: str | None = None
        if reply.metadata.message_type != msg.metadata.message_type:  # Flower copies it; a client can rewrite it
            problem = f"of type {reply.metadata.message_type!r}, answering a {msg.metadata.message_type!r} message"
        if problem is None:
            problem = _claims_problem(planned, reply, array_claims)
        if problem is None:
            problem = reply_problem(msg, reply, planned, array_claims, rules)
        if problem is None and set(out.reply_of).intersection(planned):
            problem = f"clients {sorted(set(out.reply_of).intersection(planned))} already answered this round"
        if problem is not None:
            reason = f"reply from node {reply.metadata.src_node_id} rejected: {problem}"
            out.rejected.append(reason)
            out.failed.append(Message(Error(REJECTED_REPLY, reason), reply_to=msg))
            out.problem_of.update({c: reason for c in planned})
            out.answer_of.update({c: out.failed[-1] for c in planned})
            out.rejected_clients.update(planned)
            continue
        out.reply_of.update({c: reply for c in planned})
        out.answer_of.update({c: reply for c in planned})
        out.valid.append(reply)
    for mid, msg in by_id.items():
        if mid not in answered:
            out.problem_of.update({c: "no reply before the timeout" for c in planned_clients(msg)})
    out.contributors = sorted(out.reply_of)
    return out


def kept_client_metrics(checked: CheckedReplies, record_key: str = "metrics") -> dict[int, dict]:
    """Client id -> the ``record_key`` metrics of its reply, for the replies that passed the plan check.

    Only ``checked.reply_of`` is read: refused, forged and error replies never appear. A reply that
    speaks for several planned clients (``clients_per_message > 1``) reports them together, so each
    of them maps to a copy of that reply's metrics (its ``num-examples`` is their sum). Clients come
    in the order their replies were accepted (what the ultrasound study's tables have always used).
    """
    out: dict[int, dict] = {}
    for c, reply in checked.reply_of.items():
        if record_key in reply.content.metric_records:
            rec = reply.content.metric_records[record_key]
            out[c] = {k: list(v) if isinstance(v, list) else v for k, v in rec.items()}
    return out


class PlanChecked(Layer):
    """Mixin for strategies and wrappers: remember the round's messages, check replies against them.

    ``configure_train`` returns ``self.remember(messages)``; ``aggregate_train`` starts with
    ``checked = self.check(server_round, replies)``. Rejections are logged once per layer.

    Every check keeps, in this layer's own ``client_metrics`` (round -> client id -> metrics, see
    :func:`kept_client_metrics`), the per-client metrics of the replies that passed it, so that a
    study can write per-client metrics without an observer; ``problems`` keeps why the others did
    not contribute (:func:`round_problems`). Both are strategies.layer.PerLayer records: a wrapper's
    are its own, never the wrapped strategy's.
    """

    _sent: Iterable[Message] = ()  # this round's messages, once remembered

    def reply_rules_in_force(self) -> ReplyRules:
        """The rules replies are checked with: the first layer (this one, then the strategies it wraps,
        strategies.layer.layers) that was given ``reply_rules``, else the defaults; with the
        ``required_metrics`` of every layer added."""
        found: ReplyRules | None = None
        required: set[str] = set()
        for layer in layers(self):
            if isinstance(layer, Layer):
                required |= layer.required_metrics
                if found is None:
                    found = layer.reply_rules
        rules = found or DEFAULT_RULES
        if required - rules.required_metrics:
            rules = replace(rules, required_metrics=rules.required_metrics | required)
        return rules

    def remember(self, messages: Iterable[Message]) -> list[Message]:
        """Keep this round's messages (Flower sets their ids when it pushes them)."""
        sent = list(messages)
        self._sent = sent
        return sent

    def check(self, server_round: int, replies: Iterable[Message]) -> CheckedReplies:
        """:func:`check_replies` against the remembered messages, logging every rejection."""
        checked = check_replies(self._sent, replies, self.array_claims, self.reply_rules_in_force())
        for reason in checked.rejected:
            _log.warning("round %d: %s; counted as a failed client", server_round, reason)
        # round -> {logical client: why it did not contribute}, this layer's own; see :func:`round_problems`
        self.problems[server_round] = dict(checked.problem_of)
        self.client_metrics[server_round] = kept_client_metrics(checked)
        return checked


def round_problems(strategy: object) -> dict[int, dict[int, str]]:
    """Per round, every planned client that did not contribute and why, merged over the layers of ``strategy``
    (strategies.layer.layers, outermost first: an outer layer's reason wins)."""
    out: dict[int, dict[int, str]] = {}
    for layer in layers(strategy):
        if isinstance(layer, Layer):
            for r, probs in layer.problems.items():
                for c, why in probs.items():
                    out.setdefault(r, {}).setdefault(c, why)
    return out


def exchange(grid: Grid, messages: list[Message], timeout: float | None, array_claims: str = "each",
             rules: ReplyRules = DEFAULT_RULES) -> CheckedReplies:
    """Send ``messages`` (one exchange loop with fast polling) and check the replies against them."""
    from strategies.transport import send_and_receive

    replies = send_and_receive(grid, messages, timeout=timeout)
    return check_replies(messages, replies, array_claims, rules)
