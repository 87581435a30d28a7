"""Typed errors of the mixnet: every rejection of untrusted bytes is one of these.

Parsers check lengths first and never let a foreign exception (``IndexError``,
``struct.error``, ``cryptography``'s ``ValueError``) escape: a fuzzer that finds
anything but a :class:`MixnetError` has found a bug.
"""

from __future__ import annotations


class MixnetError(Exception):
    """Base class of every error raised on untrusted input."""


class InvalidPacket(MixnetError):
    """A packet of the wrong total length, or otherwise unparsable."""


class InvalidHeader(MixnetError):
    """Header rejected: bad length, non-canonical or low-order group element, MAC failure, bad flag."""


class InvalidPayload(MixnetError):
    """Body rejected at the destination (zero-prefix check failed) or malformed plaintext."""


class InvalidSURB(MixnetError):
    """SURB malformed, unknown to its creator, or used a second time."""


class ReplayDetected(MixnetError):
    """A node saw the same replay tag (same shared secret) twice."""


class InvalidFrame(MixnetError):
    """A link-level frame (packet or control message) that cannot be parsed."""


class InvalidPeerKey(MixnetError):
    """A peer's announced X25519 key: wrong length, non-canonical, or a low-order point."""


class InvalidPeerRecord(MixnetError):
    """A peer record whose Ed25519 signature does not verify under the identity key it names."""
