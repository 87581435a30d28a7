"""Conventions for the records the project's strategies exchange.

Outgoing train message: ``{"arrays": ArrayRecord, "config": ConfigRecord}`` where the
config carries ``client-ids`` (the logical clients this message asks the node to play,
in order) and ``run-config`` (the study config as JSON).

Reply: one ArrayRecord per logical client under ``client.<id>`` (for a token-passing
chain: only the token after the last client), and a MetricRecord ``metrics`` with
``num-examples``, ``train-loss`` and ``client-ids`` (the clients actually trained, in order).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message

CLIENT_PREFIX = "client."


# Flower types a record's value as the union of every value type a record may hold, and a RecordDict's
# item as any record. These name what the code reads (runtime: the value itself, unchecked; the checks
# are strategies.cohorts and strategies.reply_rules).
def number(value: object) -> int | float:
    """A record value read as a number (typing only)."""
    return cast("int | float", value)


def int_list(value: object) -> list[int]:
    """A record value read as a list of ints (typing only)."""
    return cast("list[int]", value)


def array_record(value: object) -> ArrayRecord:
    """A RecordDict item read as an ArrayRecord (typing only)."""
    return cast(ArrayRecord, value)


def config_of(value: object) -> ConfigRecord:
    """A RecordDict item read as a ConfigRecord (typing only)."""
    return cast(ConfigRecord, value)


def client_key(client_id: int) -> str:
    """Record key of a logical client's model."""
    return f"{CLIENT_PREFIX}{client_id}"


def client_arrays(reply: Message) -> dict[int, ArrayRecord]:
    """All per-client ArrayRecords in a reply, by logical client id."""
    out: dict[int, ArrayRecord] = {}
    for key, rec in reply.content.array_records.items():
        if key.startswith(CLIENT_PREFIX):
            out[int(key[len(CLIENT_PREFIX):])] = rec
    return out


def to_numpy(record: ArrayRecord) -> OrderedDict[str, np.ndarray]:
    """ArrayRecord -> ordered name -> ndarray."""
    return OrderedDict((k, v.numpy()) for k, v in record.items())


def from_numpy(arrays: OrderedDict[str, np.ndarray] | dict[str, np.ndarray]) -> ArrayRecord:
    """Ordered name -> ndarray -> ArrayRecord."""
    return ArrayRecord(OrderedDict((k, Array(np.ascontiguousarray(v))) for k, v in arrays.items()))


def valid_replies(replies: list[Message]) -> tuple[list[Message], list[Message]]:
    """Split replies into (without error, with error)."""
    ok = [m for m in replies if not m.has_error()]
    bad = [m for m in replies if m.has_error()]
    return ok, bad
