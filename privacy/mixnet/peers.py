"""Each node's own peer view: no global registry at run time.

A view maps node ids to their Sphinx public keys (and, in network mode, their
``host:port``). Peers enter through JOIN/VIEW control messages and leave the
routable set when a connectivity check fails; missed acknowledgements only
raise suspicion, which triggers such a check. A key enters a view only after
:func:`~privacy.mixnet.crypto.validate_public_key`: one low-order key in a view
would make every packet routed through that peer impossible to build.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from .constants import GROUP_ELEMENT_SIZE
from .crypto import validate_public_key
from .header import Hop


@dataclass
class PeerInfo:
    node_id: int
    public_key: bytes
    endpoint: str = ""
    _key: X25519PublicKey | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.public_key) != GROUP_ELEMENT_SIZE:
            raise ValueError(f"public_key must be {GROUP_ELEMENT_SIZE} bytes, got {len(self.public_key)}")

    @property
    def key(self) -> X25519PublicKey:
        """The validated public key; raises :class:`~privacy.mixnet.errors.InvalidPeerKey` if it is bad."""
        if self._key is None:  # validated and parsed once, reused for every packet to this peer
            self._key = X25519PublicKey.from_public_bytes(validate_public_key(self.public_key))
        return self._key


class PeerView:
    """Known peers of one node, the routable (believed alive) subset, and suspicion counts."""

    def __init__(self, self_info: PeerInfo) -> None:
        self.self_id = self_info.node_id
        self._peers: dict[int, PeerInfo] = {self_info.node_id: self_info}
        self._alive: set[int] = set()
        self._routable_cache: list[int] | None = None
        self.suspicion: dict[int, int] = {}

    def add(self, info: PeerInfo) -> bool:
        """Learn or refresh a peer and mark it routable; True if the view changed.

        Raises :class:`~privacy.mixnet.errors.InvalidPeerKey` (and changes nothing)
        if the announced key is bad.
        """
        if info.node_id == self.self_id:
            return False
        info.key  # validate before storing: a bad key must never replace a good one
        old = self._peers.get(info.node_id)
        changed = old is None or old.public_key != info.public_key or old.endpoint != info.endpoint
        if changed:
            self._peers[info.node_id] = info
        if info.node_id not in self._alive:
            self._alive.add(info.node_id)
            changed = True
        self.suspicion.pop(info.node_id, None)
        self._routable_cache = None
        return changed

    def mark_alive(self, node_id: int) -> None:
        if node_id in self._peers and node_id != self.self_id and node_id not in self._alive:
            self._alive.add(node_id)
            self._routable_cache = None
        self.suspicion.pop(node_id, None)

    def remove(self, node_id: int) -> bool:
        """Drop a peer from route sampling (its key is kept in case it comes back)."""
        if node_id in self._alive:
            self._alive.discard(node_id)
            self._routable_cache = None
            return True
        return False

    def blame(self, node_id: int) -> int:
        """One more missed acknowledgement on a path through ``node_id``."""
        if node_id == self.self_id:
            return 0
        self.suspicion[node_id] = self.suspicion.get(node_id, 0) + 1
        return self.suspicion[node_id]

    def absolve(self, node_id: int) -> None:
        self.suspicion.pop(node_id, None)

    def routable(self) -> list[int]:
        """Sorted live peers (self excluded); sorted so a seed fixes route sampling."""
        if self._routable_cache is None:
            self._routable_cache = sorted(self._alive)
        return self._routable_cache

    def is_alive(self, node_id: int) -> bool:
        return node_id in self._alive

    def get(self, node_id: int) -> PeerInfo | None:
        return self._peers.get(node_id)

    def hop(self, node_id: int) -> Hop:
        info = self._peers.get(node_id)
        if info is None:
            raise KeyError(f"node {node_id} is not in the peer view of {self.self_id}")
        return Hop(node_id, info.key)

    def known(self) -> list[PeerInfo]:
        return [self._peers[i] for i in sorted(self._peers)]
