"""Every named (non-secret) random stream of the platform, and the one place a seed is derived.

A run has one integer seed; each random choice of the run (a partition, a split, victims, an attack's
samples, a client's batch order) draws from its own **stream**, a generator keyed by that seed and the
stream's tag. This module holds the table of streams: ``name -> key``. Code asks for a stream by
name, never writes a key, a tag or seed arithmetic inline::

    rng("datasets.partition", seed)                      # np.random.default_rng([seed, 3])
    rng("attacks.victim-candidates", seed, victim)       # np.random.default_rng([seed, victim, 14])
    torch_generator("clients.sgd", seed, round, client)  # torch.Generator().manual_seed(client seed)

The tags are the integers the inline calls used before this module existed, so every draw is
bit-identical to the published runs (``tests/registry/test_streams.py`` compares a few streams with
the old inline expressions written out by hand).

Three kinds of stream:

* ``rng``: ``np.random.default_rng(key)``; the key is the stream's template with the seed and the
  named fields filled in, e.g. ``("seed", "victim", 14)`` -> ``[seed, victim, 14]``. Integers in the
  template are the stream's tag.
* ``spawn``: the children of ``np.random.SeedSequence(key)`` (independent sub-streams, one per
  reference model, restart, ...).
* ``int``: an integer seed (for ``torch.Generator`` or a ``seed=`` argument) from a **legacy seed
  derivation**. These are the only seed arithmetic of the platform, kept because published numbers
  depend on them, and documented where they are declared:
  ``Offset(k)``: ``seed + k``; ``Scaled(f)``: ``seed * f + field``; ``ClientSeed(m, modulus)``:
  ``((seed * 1,000,003 + round) * m + client) % modulus``.

Refusals. A name is registered once (the same declaration again is a no-op, so a module that
registers its study's streams may be imported twice). Two names whose keys can coincide (same kind;
templates of one length that agree wherever both hold a tag, one seed per run, any other field
values: ``[seed, 3]`` and ``[seed, client]`` meet at client 3; for ``int`` streams, the same
derivation) are refused when they can meet in one run: in the same scope (the name's prefix before
the first dot, e.g. ``ultrasound``), or when either is in a shared scope (``datasets``, ``attacks``,
``clients``: drawn by any study). So two names never share a tag where it matters. A legacy overlap
kept for the published numbers is declared with ``shares=`` and its reason.

Not here: DP noise. Its streams (``privacy/randomness.py``: ``STREAM_MATCHED_PERTURBATION``,
``STREAM_TABULAR_SERVER``, ``STREAM_DPSGD``; ``privacy/audit/canaries.py``: ``STREAM_AUDIT_CANARIES``;
``privacy/sampling.py``: ``STREAM_CLIENT_SAMPLING``, the server's cohort draw under client sampling, which
amplification by sampling needs secret from the clients) are secret: drawn from OS entropy or a party's own
seed file, never from the run seed, which every message carries (see ``NOISE_STREAMS``). Torch's global generator
is never seeded here: a region that must draw from it (dropout masks in a training loop, initial weights) runs inside
``models.seeded_init.seeded_init``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

#: scopes whose streams any study may draw (a study's own streams live under the study's name)
SHARED_SCOPES = frozenset({"datasets", "attacks", "clients"})
ROUND_MULTIPLIER = 1_000_003  # a prime > any round count: (seed, round) pairs do not collide
CLIENT_MULTIPLIER = 10_007  # a prime > any client count: (seed, round, client) triples do not collide

Kind = Literal["rng", "spawn", "int"]


@dataclass(frozen=True)
class Offset:
    """Legacy derivation ``seed + k`` (``k = 0``: the seed itself)."""

    k: int
    fields: tuple[str, ...] = ()

    def __call__(self, seed: int) -> int:
        return seed + self.k


@dataclass(frozen=True)
class Scaled:
    """Legacy derivation ``seed * factor + <field>`` (one integer field, e.g. a victim)."""

    factor: int
    index: str = field(default="index", compare=False)  # the field's name; not part of the numbers

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.index,)

    def __call__(self, seed: int, i: int) -> int:
        return seed * self.factor + i


@dataclass(frozen=True)
class ClientSeed:
    """The per-client derivation ``(seed * ROUND_MULTIPLIER + round) * client_multiplier + client``, then
    ``% modulus`` (None: unreduced). The studies' published tables used different constants (10,007 or
    1,000,003; none, 2**62 or 2**63); each study has its own stream so its numbers stay the same."""

    client_multiplier: int = CLIENT_MULTIPLIER
    modulus: int | None = None
    fields: tuple[str, ...] = ("round", "client")

    def __call__(self, seed: int, server_round: int, client: int) -> int:
        s = (seed * ROUND_MULTIPLIER + server_round) * self.client_multiplier + client
        return s if self.modulus is None else s % self.modulus


Derivation = Offset | Scaled | ClientSeed


@dataclass(frozen=True)
class Stream:
    """One named random stream.

    Parameters
    ----------
    name : ``<scope>.<purpose>``, e.g. ``dfl-dp.victims``; the scope is a study or a shared package.
    key : the key template of an ``rng`` / ``spawn`` stream: ``"seed"``, field names (filled in the order
        given) and integer tags, e.g. ``("seed", "victim", 14)``.
    kind : ``rng``, ``spawn`` or ``int`` (see the module docstring).
    derive : the legacy seed derivation of an ``int`` stream.
    shares : the streams whose keys this one knowingly coincides with (legacy; the reason in ``doc``).
    doc : what the stream draws, and why a legacy derivation or overlap is kept.
    """

    name: str
    key: tuple[str | int, ...] = ()
    kind: Kind = "rng"
    derive: Derivation | None = None
    shares: tuple[str, ...] = ()
    doc: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.name or "." not in self.name:
            raise ValueError(f"stream name must be '<scope>.<purpose>', got {self.name!r}")
        if self.kind not in ("rng", "spawn", "int"):
            raise ValueError(f"stream {self.name}: kind must be rng, spawn or int, got {self.kind!r}")
        if self.kind == "int":
            if self.derive is None or self.key:
                raise ValueError(f"stream {self.name}: an int stream has a derivation and no key template")
        else:
            if self.derive is not None or self.key.count("seed") != 1:
                raise ValueError(f"stream {self.name}: a key template names 'seed' once and has no derivation")
            names = [k for k in self.key if isinstance(k, str)]
            if len(set(names)) != len(names) or any(isinstance(k, bool) for k in self.key):
                raise ValueError(f"stream {self.name}: key fields must be distinct names or int tags, got {self.key}")

    @property
    def scope(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields a caller passes after the seed, in order."""
        if self.derive is not None:
            return self.derive.fields
        return tuple(k for k in self.key if isinstance(k, str) and k != "seed")

    @property
    def tags(self) -> tuple[int, ...]:
        return tuple(k for k in self.key if isinstance(k, int))

    def can_meet(self, other: Stream) -> bool:
        """True when the two streams can produce the same key (the same generator) in one run.

        Same kind, and: the same derivation (``int``), or templates of one length that agree wherever
        both hold a tag, the seed being one value in a run and the other fields any values.
        """
        if self.kind != other.kind or (self.derive is None) != (other.derive is None):
            return False
        if self.derive is not None:
            return self.derive == other.derive
        if len(self.key) != len(other.key):
            return False
        seed: set[int] = set()
        for a, b in zip(self.key, other.key):
            tags = [v for v in (a, b) if isinstance(v, int)]
            if len(tags) == 2 and a != b:
                return False
            if len(tags) == 1 and "seed" in (a, b):
                seed.add(tags[0])  # the seed would have to be this tag
        return len(seed) <= 1

    def seed_key(self, seed: int, *extra: int) -> list[int]:
        """The key of an ``rng`` / ``spawn`` stream for ``seed`` and the fields ``extra``."""
        if self.kind == "int":
            raise TypeError(f"stream {self.name} is an int stream: use seed_int / torch_generator")
        values = dict(zip(("seed", *self.fields), _ints(self, seed, extra)))
        return [k if isinstance(k, int) else values[k] for k in self.key]

    def seed_int(self, seed: int, *extra: int) -> int:
        """The integer seed of an ``int`` stream."""
        if self.derive is None:
            raise TypeError(f"stream {self.name} is a {self.kind} stream: use rng / spawn")
        return self.derive(*_ints(self, seed, extra))


def _ints(stream: Stream, seed: int, extra: tuple[int, ...]) -> list[int]:
    if len(extra) != len(stream.fields):
        raise TypeError(f"stream {stream.name} takes seed and {list(stream.fields)}, got {1 + len(extra)} values")
    return [operator.index(v) for v in (seed, *extra)]


class StreamRegistry(dict[str, Stream]):
    """``name -> Stream``; refuses a taken name and a key shape two streams of one run could share."""

    def register(self, stream: Stream) -> Stream:
        old = self.get(stream.name)
        if old is not None:
            if old == stream:
                return old
            raise ValueError(f"stream {stream.name!r} is already registered as {old}")
        for name in stream.shares:
            if name not in self:
                raise ValueError(f"stream {stream.name!r} shares {name!r}, which is not registered")
        for other in self.values():
            meet = other.scope == stream.scope or SHARED_SCOPES & {other.scope, stream.scope}
            declared = other.name in stream.shares or stream.name in other.shares
            if meet and not declared and stream.can_meet(other):
                raise ValueError(f"stream {stream.name!r} can draw the key of {other.name!r} ({other.key or other.derive})"
                                 " in one run: give it another tag")
        self[stream.name] = stream
        return stream


STREAMS = StreamRegistry()
register = STREAMS.register


def stream(name: str) -> Stream:
    """The registered stream ``name`` (KeyError naming the known ones otherwise)."""
    try:
        return STREAMS[name]
    except KeyError:
        raise KeyError(f"unknown random stream {name!r}; registered: {sorted(STREAMS)}") from None


def rng(name: str, seed: int, *extra: int) -> np.random.Generator:
    """``np.random.default_rng(key)`` of the ``rng`` stream ``name`` for ``seed`` and its fields."""
    s = stream(name)
    if s.kind != "rng":
        raise TypeError(f"stream {name} is a {s.kind} stream, not an rng stream")
    return np.random.default_rng(s.seed_key(seed, *extra))


def spawn(name: str, seed: int, n: int, *extra: int) -> list[np.random.SeedSequence]:
    """The ``n`` children of ``np.random.SeedSequence(key)`` of the ``spawn`` stream ``name``."""
    s = stream(name)
    if s.kind != "spawn":
        raise TypeError(f"stream {name} is a {s.kind} stream, not a spawn stream")
    key = s.seed_key(seed, *extra)
    return np.random.SeedSequence(key[0] if len(key) == 1 else key).spawn(n)


def seed_int(name: str, seed: int, *extra: int) -> int:
    """The integer seed of the ``int`` stream ``name`` (its documented legacy derivation)."""
    return stream(name).seed_int(seed, *extra)


def torch_generator(name: str, seed: int, *extra: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`seed_int` of the ``int`` stream ``name``."""
    import torch

    return torch.Generator().manual_seed(seed_int(name, seed, *extra))


#: the secret noise streams (privacy/randomness.py, privacy/audit/canaries.py): labels mixed into a
#: NoiseSource's OS entropy or a party's seed file, never the run seed. Listed here so that a new
#: stream's tag is chosen apart from them; drawn only through ``privacy.randomness.NoiseSource``.
NOISE_STREAMS = {"matched-perturbation": 0xD9, "tabular-server": 0x7AB, "dpsgd": 0xD95D, "audit-canaries": 0xA0D17,
                 "client-sampling": 0xC0407}


def _r(name: str, *key: str | int, doc: str, kind: Kind = "rng", shares: tuple[str, ...] = ()) -> None:
    register(Stream(name, tuple(key), kind, shares=shares, doc=doc))


def _i(name: str, derive: Derivation, doc: str, shares: tuple[str, ...] = ()) -> None:
    register(Stream(name, kind="int", derive=derive, shares=shares, doc=doc))


# --- shared: datasets
_r("datasets.partition", "seed", 3,
   doc="clients' partition (datasets.partition, image_plan's target part, unlinkable-dfl's nodes)")
_r("datasets.four-way-split", "seed", 4, doc="target / shadow train / holdout split (datasets.splits)")
_r("datasets.shadow-partition", "seed", 5, doc="clients' partition of image_plan's shadow part")
_r("datasets.test-split", "seed", 7, doc="held-out test set (datasets.splits, BUSI's global test set)")
_r("datasets.subsample", "seed", 11, doc="fixed-seed subsample (data-fraction)")
_r("datasets.busi-val", "seed", 21, doc="BUSI train / validation split")
_r("datasets.busi-subsample", "seed", 97, doc="BUSI subsample")
# --- shared: attacks
_r("attacks.victim-candidates", "seed", "victim", 14,
   doc="a victim's member / non-member candidates and the adversary's pool (tabular-pdp, ultrasound)")
_r("attacks.shadow-halves", "seed", 41, doc="the pool's halves: shadow members / non-members")
_r("attacks.lira-references", "seed", 17, kind="spawn", doc="LiRA reference subsets, one child per model")
_r("attacks.shadow-balance", "seed", kind="spawn",
   doc="shadow MIA balancing: children 0, 1 shadow members / non-members; 2, 3 target")
_r("attacks.inversion-restarts", "seed", kind="spawn", shares=("attacks.shadow-balance",),
   doc="one 32-bit seed per inversion restart. Legacy: the same SeedSequence(seed) as the shadow balancing "
       "(an ultrasound attack run draws both with one seed); kept for the published attack tables")
# --- shared: per-client generators (batch order, dropout masks, augmentation)
_i("clients.sgd", ClientSeed(), "a client's local training in a round (dfl-dp, unlinkable-dfl, example-minimal)")
# --- dfl-dp
_r("dfl-dp.lira-candidates", "seed", 14, doc="LiRA's member / non-member candidates")
_r("dfl-dp.victims", "seed", 17, doc="the clients whose gradients are captured")
_i("dfl-dp.inversion-noise", Scaled(1000, "victim"),
   "the DP-noised update an inversion attack sees. Legacy seed * 1000 + victim (published attack tables)")
# --- tabular-pdp
_i("tabular-pdp.client", ClientSeed(1_000_003, 2**63),
   "a client's batch order; multiplier 1,000,003 and modulus 2**63 as Table III was computed")
_r("tabular-pdp.client-table", "seed", "client",
   shares=tuple(n for n, s in STREAMS.items() if s.scope in SHARED_SCOPES and s.kind == "rng" and len(s.key) == 2),
   doc="a client's synthetic cancer table, drawn with seed datasets.cancer.GENERATOR_SEED (2015), not the run "
       "seed. Legacy, untagged: [2015, client] is every shared [seed, tag] stream's key at run seed 2015 for "
       "client = tag; kept for the published table")
_r("tabular-pdp.client-split", "seed", "client", 80, doc="a client's train / test split")
# --- ultrasound
_i("ultrasound.client", ClientSeed(CLIENT_MULTIPLIER, 2**62),
   "a client's seed in a round (batches, augmentation, DP-SGD); mod 2**62 as the published runs")
_i("ultrasound.batches", Offset(0), "batch order of local training (the client seed itself)")
_i("ultrasound.augmentation", Offset(7), "augmentation of local training. Legacy: client seed + 7 (published runs)")
_i("ultrasound.inversion-noise", Scaled(1000, "image"),
   "the DP-SGD noise of an inverted image's update. Legacy: seed * 1000 + image (published attack tables)")
_r("ultrasound.partition", "seed", 23, doc="clients' label / quantity partition")
_r("ultrasound.scanner-profiles", "seed", 31, doc="clients' scanner (feature-skew) profiles")
_r("ultrasound.inversion-picks", "seed", "victim", 99, doc="the victim's images an inversion attack targets")
_r("ultrasound.audit-canaries", 0xA0D17, "seed", doc="audit canaries' coin flips (server and client)")
_r("ultrasound.audit-coords", 0xA0D17, "seed", 1, doc="gradient canaries' coordinates (fixed over rounds)")
_r("ultrasound.audit-steps", 0xA0D17, "seed", 2, "round", doc="gradient canaries' step sampling of a round")
# --- unlinkable-dfl
_r("unlinkable-dfl.eval-order", "seed", 5, shares=("datasets.shadow-partition",),
   doc="order of the held-out test images (seed: TEST_HOLDOUT_SEED); never meets image_plan's shadow part")
_r("unlinkable-dfl.linking-targets", "seed", 9, doc="the network experiment's attacked targets")
_r("unlinkable-dfl.flow-correlation", "seed", 10, doc="the flow-correlation attack's choices")
_r("unlinkable-dfl.byzantine-nodes", "seed", 17, doc="which nodes are Byzantine")
_r("unlinkable-dfl.quantization", "seed", "round", "node", 1, doc="a node's stochastic quantization in a round")
_r("unlinkable-dfl.sends", "seed", "round", "node", 2, doc="which fragments a node sends to whom")
_r("unlinkable-dfl.byzantine-values", "seed", "round", "node", 3, doc="a Byzantine node's forged values")
# --- example-minimal (flower_apps/example_minimal.py)
_r("example-minimal.subsample", "seed", 1, doc="the data-fraction subsample")
