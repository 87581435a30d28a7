"""What a mix node needs from its host (simulator or network process): clock, timers, links, sinks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .delivery import DeliveredMessage


class Cancellable(Protocol):
    def cancel(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class TxMeta:
    """Hidden bookkeeping attached to a transmission (never on the wire)."""

    kind: str
    in_ref: object = None
    message_id: bytes | None = None  # the message a real/retransmission/ack frame belongs to (scoring only)


class NodeEnvironment(Protocol):
    """What a node needs from its host: a clock, timers, links and result sinks."""

    def now(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable: ...

    def transmit(self, src: int, dst: int, frame: bytes, meta: TxMeta) -> None: ...

    def on_delivered(self, node_id: int, message: DeliveredMessage) -> None: ...

    def on_acked(self, node_id: int, message_id: bytes) -> None: ...

    def on_failed(self, node_id: int, message_id: bytes) -> None: ...
