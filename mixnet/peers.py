"""Each node's own peer view: no global registry at run time.

A view maps node ids to signed peer records: the node's Sphinx public key and,
in network mode, its ``host:port``, signed by the node's Ed25519 identity key
(:mod:`mixnet.identity`). Peers enter through JOIN/VIEW control
messages and leave the routable set when a connectivity check fails; missed
acknowledgements only raise suspicion, which triggers such a check.

Who may change what (:meth:`PeerView.add`): the first record of a node pins its
identity key; afterwards only a newer record signed under that key replaces it,
whoever relays it. A record under another identity is a hijack attempt and is
refused, unless it comes from the node itself over its authenticated link or
from the trusted bootstrap directory. A key enters a view only after
:func:`~mixnet.crypto.validate_public_key`: one low-order key in a view
would make every packet routed through that peer impossible to build. The view
holds at most ``max_peers`` records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from .constants import GROUP_ELEMENT_SIZE
from .crypto import validate_public_key
from .header import Hop
from .identity import IDENTITY_KEY_SIZE, SIGNATURE_SIZE, identity_public_bytes, sign, signed_body, verify

#: Default bound on the records one view holds (self included).
DEFAULT_MAX_PEERS = 4096


@dataclass
class PeerInfo:
    """One peer record. ``identity``/``version``/``signature`` are all zeros in an unsigned record."""

    node_id: int
    public_key: bytes
    endpoint: str = ""
    identity: bytes = bytes(IDENTITY_KEY_SIZE)
    version: int = 0
    signature: bytes = bytes(SIGNATURE_SIZE)
    _key: X25519PublicKey | None = field(default=None, repr=False, compare=False)
    _verified: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.public_key) != GROUP_ELEMENT_SIZE:
            raise ValueError(f"public_key must be {GROUP_ELEMENT_SIZE} bytes, got {len(self.public_key)}")
        if len(self.identity) != IDENTITY_KEY_SIZE or len(self.signature) != SIGNATURE_SIZE:
            raise ValueError(f"identity and signature must be {IDENTITY_KEY_SIZE} and {SIGNATURE_SIZE} bytes, "
                             f"got {len(self.identity)} and {len(self.signature)}")
        if not 0 <= self.version < 1 << 64:
            raise ValueError(f"version must be a uint64, got {self.version}")

    @classmethod
    def signed(cls, identity_key: Ed25519PrivateKey, node_id: int, public_key: bytes, endpoint: str = "",
               version: int = 0) -> PeerInfo:
        """The record a node makes about itself."""
        identity = identity_public_bytes(identity_key)
        signature = sign(identity_key, signed_body(node_id, public_key, identity, version, endpoint))
        return cls(node_id, public_key, endpoint, identity, version, signature, _verified=True)

    @property
    def key(self) -> X25519PublicKey:
        """The validated public key; raises :class:`~mixnet.errors.InvalidPeerKey` if it is bad."""
        if self._key is None:  # validated and parsed once, reused for every packet to this peer
            self._key = X25519PublicKey.from_public_bytes(validate_public_key(self.public_key))
        return self._key

    def verify(self) -> None:
        """Raise :class:`~mixnet.errors.InvalidPeerRecord` unless the record is signed by ``identity``."""
        if not self._verified:  # cached: the simulator hands one object to every node
            verify(self.identity, self.signature,
                   signed_body(self.node_id, self.public_key, self.identity, self.version, self.endpoint))
            self._verified = True

    def same_record(self, other: PeerInfo) -> bool:
        return self == other


class Authority(Enum):
    """Who vouches for a record, besides its signature."""

    DIRECTORY = "directory"  # the bootstrap directory handed over by the operator
    SELF = "self"  # the node itself, over the link that authenticates it (TLS certificate / simulator link)
    RELAYED = "relayed"  # any other peer: only the signature under the pinned identity counts


class Outcome(Enum):
    """What :meth:`PeerView.add` did with a record."""

    NEW = "new"  # a node not known before
    UPDATED = "updated"  # a newer record (or a re-pinned identity) replaced the stored one
    REVIVED = "revived"  # the stored record again; the node is routable again
    UNCHANGED = "unchanged"
    HIJACK = "hijack"  # a known node under another identity, from a third party: refused
    STALE = "stale"  # not newer than the stored record of the same identity: refused
    FULL = "full"  # the view holds max_peers records and none is evictable: refused

    @property
    def changed(self) -> bool:
        return self in (Outcome.NEW, Outcome.UPDATED, Outcome.REVIVED)

    @property
    def accepted(self) -> bool:
        return self not in (Outcome.HIJACK, Outcome.STALE, Outcome.FULL)


class PeerView:
    """Known peers of one node, the routable (believed alive) subset, and suspicion counts."""

    def __init__(self, self_info: PeerInfo, max_peers: int = DEFAULT_MAX_PEERS) -> None:
        if not isinstance(max_peers, int) or max_peers < 2:
            raise ValueError(f"max_peers must be an int >= 2, got {max_peers!r}")
        self.self_id = self_info.node_id
        self.max_peers = max_peers
        self._peers: dict[int, PeerInfo] = {self_info.node_id: self_info}
        self._alive: set[int] = set()
        self._routable_cache: list[int] | None = None
        self.suspicion: dict[int, int] = {}
        self.evicted = 0

    def set_self(self, info: PeerInfo) -> None:
        """This node's own record changed (a Sphinx key rotation)."""
        if info.node_id != self.self_id:
            raise ValueError(f"info must describe node {self.self_id}, got {info.node_id}")
        self._peers[self.self_id] = info

    def add(self, info: PeerInfo, authority: Authority = Authority.RELAYED) -> Outcome:
        """Learn or refresh a peer record and mark it routable.

        Raises :class:`~mixnet.errors.InvalidPeerKey` (bad X25519 key) or
        :class:`~mixnet.errors.InvalidPeerRecord` (bad signature) and
        changes nothing; refusals by policy are returned as an :class:`Outcome`.
        """
        if info.node_id == self.self_id:
            return Outcome.UNCHANGED
        _ = info.key  # validate before anything else: a bad key must never replace a good one
        old = self._peers.get(info.node_id)
        if old is None or not old.same_record(info):
            info.verify()
            if old is not None:
                if old.identity != info.identity:
                    if authority is Authority.RELAYED:  # only the node itself (or the directory) re-pins
                        return Outcome.HIJACK
                elif info.version <= old.version:
                    return Outcome.STALE
            elif len(self._peers) >= self.max_peers and not self._evict_one():
                return Outcome.FULL
            self._peers[info.node_id] = info
            outcome = Outcome.NEW if old is None else Outcome.UPDATED
        else:
            outcome = Outcome.UNCHANGED
        if info.node_id not in self._alive:
            self._alive.add(info.node_id)
            self._routable_cache = None
            if outcome is Outcome.UNCHANGED:
                outcome = Outcome.REVIVED
        self.suspicion.pop(info.node_id, None)
        return outcome

    def _evict_one(self) -> bool:
        """Make room by forgetting the lowest-id peer believed dead; False if every peer is routable."""
        dead = sorted(i for i in self._peers if i != self.self_id and i not in self._alive)
        if not dead:
            return False
        del self._peers[dead[0]]
        self.suspicion.pop(dead[0], None)
        self.evicted += 1
        return True

    def mark_alive(self, node_id: int) -> None:
        if node_id in self._peers and node_id != self.self_id and node_id not in self._alive:
            self._alive.add(node_id)
            self._routable_cache = None
        self.suspicion.pop(node_id, None)

    def remove(self, node_id: int) -> bool:
        """Drop a peer from route sampling (its record is kept in case it comes back)."""
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

    def __len__(self) -> int:
        return len(self._peers)
