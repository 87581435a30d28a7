"""Every size of the Sphinx packet format, derived from one security parameter.

Follows the layout of Nym's ``sphinx`` crate (``src/constants.rs``): ``k`` is the
security parameter of the Sphinx paper (Danezis & Goldberg, S&P 2009), in bytes;
every field length below is a multiple of it or a fixed primitive size.
:class:`PacketFormat` adds the two per-deployment choices (``r``, the header's
hop capacity, and the payload body size) and derives the rest.

Wire layout of one packet (all lengths in bytes, ``c`` = routing block)::

    header  = alpha (32) || beta (r * c) || gamma (k)
    packet  = header || body (payload_size)
    block c = flag (1) || next-hop address (k) || delay (k/2) || next gamma (k)
    body    = LIONESS layers over ( 0^k || plaintext )
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``k`` in the Sphinx paper, in bytes (128-bit security).
SECURITY_PARAMETER: int = 16

# --- primitive sizes --------------------------------------------------------
#: X25519 group element (Montgomery u-coordinate) and scalar.
GROUP_ELEMENT_SIZE: int = 2 * SECURITY_PARAMETER
SCALAR_SIZE: int = 2 * SECURITY_PARAMETER
#: ChaCha20 key; ``cryptography``'s ChaCha20 takes a 16-byte counter||nonce.
STREAM_KEY_SIZE: int = 2 * SECURITY_PARAMETER
STREAM_NONCE_SIZE: int = SECURITY_PARAMETER
#: HMAC-SHA256 key; tags are truncated to ``k`` bytes (as Nym's header MAC).
MAC_KEY_SIZE: int = 2 * SECURITY_PARAMETER
MAC_SIZE: int = SECURITY_PARAMETER
#: LIONESS: left part = one ChaCha20 key / one SHA-256 output; four round keys.
LIONESS_LEFT_SIZE: int = 2 * SECURITY_PARAMETER
LIONESS_ROUND_KEY_SIZE: int = 2 * SECURITY_PARAMETER
LIONESS_KEY_SIZE: int = 4 * LIONESS_ROUND_KEY_SIZE
BLINDING_FACTOR_SIZE: int = SCALAR_SIZE
REPLAY_TAG_SIZE: int = SECURITY_PARAMETER
#: Per-hop key material from one HKDF call: stream, MAC, payload, blinding, replay tag.
HOP_KEY_MATERIAL_SIZE: int = (
    STREAM_KEY_SIZE + MAC_KEY_SIZE + LIONESS_KEY_SIZE + BLINDING_FACTOR_SIZE + REPLAY_TAG_SIZE
)
HKDF_INFO: bytes = b"ppfl-mixnet/sphinx/v1/hop-keys"
SURB_KEY_INFO: bytes = b"ppfl-mixnet/sphinx/v1/surb-key"

# --- routing information ----------------------------------------------------
FLAG_SIZE: int = 1
NODE_ADDRESS_SIZE: int = SECURITY_PARAMETER
DELAY_SIZE: int = SECURITY_PARAMETER // 2
IDENTIFIER_SIZE: int = SECURITY_PARAMETER
ROUTING_BLOCK_SIZE: int = FLAG_SIZE + NODE_ADDRESS_SIZE + DELAY_SIZE + MAC_SIZE
FLAG_FORWARD: int = 0x01
FLAG_FINAL: int = 0x02
#: Delays travel as unsigned nanoseconds.
DELAY_UNIT_S: float = 1e-9
#: All-zero identifier marks a forward message; a SURB reply carries its SURB id.
FORWARD_IDENTIFIER: bytes = bytes(IDENTIFIER_SIZE)

# --- payload ----------------------------------------------------------------
#: Destination check: the decrypted body must start with ``k`` zero bytes.
ZERO_PREFIX_SIZE: int = SECURITY_PARAMETER
SURB_KEY_SEED_SIZE: int = 2 * SECURITY_PARAMETER

# --- defaults of the UnlinkableDFL paper ------------------------------------
DEFAULT_MAX_HOPS: int = 5  # r: header capacity (Nym's MAX_PATH_LENGTH)
DEFAULT_PAYLOAD_SIZE: int = 10_240  # paper: 10,240-byte padded body

assert ROUTING_BLOCK_SIZE >= FLAG_SIZE + IDENTIFIER_SIZE  # final block fits


@dataclass(frozen=True)
class PacketFormat:
    """Sizes shared by every node of one network.

    Parameters
    ----------
    max_hops
        ``r``: how many hops the header can carry. Every header has room for
        ``r`` layers whatever the actual path length, so sizes never leak it.
    payload_size
        Length of the packet body in bytes (paper default 10,240).
    """

    max_hops: int = DEFAULT_MAX_HOPS
    payload_size: int = DEFAULT_PAYLOAD_SIZE

    def __post_init__(self) -> None:
        if not isinstance(self.max_hops, int) or not 1 <= self.max_hops <= 32:
            raise ValueError(f"max_hops must be an int in [1, 32], got {self.max_hops!r}")
        minimum = LIONESS_LEFT_SIZE + ZERO_PREFIX_SIZE + 1
        if not isinstance(self.payload_size, int) or self.payload_size < minimum:
            raise ValueError(f"payload_size must be an int >= {minimum}, got {self.payload_size!r}")

    @property
    def beta_size(self) -> int:
        """Encrypted routing information: ``r`` routing blocks."""
        return self.max_hops * ROUTING_BLOCK_SIZE

    @property
    def stream_size(self) -> int:
        """Keystream per hop: beta plus one block used to build the filler."""
        return (self.max_hops + 1) * ROUTING_BLOCK_SIZE

    @property
    def header_size(self) -> int:
        return GROUP_ELEMENT_SIZE + self.beta_size + MAC_SIZE

    @property
    def packet_size(self) -> int:
        return self.header_size + self.payload_size

    @property
    def plaintext_size(self) -> int:
        """Bytes of plaintext a body carries after the zero prefix."""
        return self.payload_size - ZERO_PREFIX_SIZE

    @property
    def surb_size(self) -> int:
        """Serialized SURB: first-hop address, header, payload key seed."""
        return NODE_ADDRESS_SIZE + self.header_size + SURB_KEY_SEED_SIZE
