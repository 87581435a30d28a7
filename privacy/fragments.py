"""Fixed-size index-range fragments of a flattened model state, and their byte encoding.

UnlinkableDFL's shareable state (learning layer): after local training a node flattens
its model into one vector ``w`` and cuts it into consecutive index ranges
``[start, stop)`` of ``values_per_fragment`` values. Every node uses the same ranges
(they depend only on the model size and the encoding), so a receiver can aggregate
range by range without knowing who sent what. A fragment carries its round and range
and **no sender identity**.

Wire format of one encoded fragment (one Sphinx packet's application data)::

    header (22 bytes) = version (1) || encoding (1) || round (4) || start (4) || count (4)
                        || lo (f32) || scale (f32)
    body              = zlib( values )      values: count x float32, or count x uint8

``float32`` is lossless; ``q8`` is unbiased 8-bit stochastic quantization
(:mod:`privacy.quantization`) of the fragment's values followed by zlib.

Fragment size derives from the Sphinx body: ``values_per_fragment`` is the largest
``n`` with ``22 + compressBound(n * bytes_per_value) <= capacity``, where
``capacity`` is the application bytes one packet carries (9,894 for the paper's
10,240-byte body, after the zero prefix, the DATA header and the SURB; see
``mixnet.messages.fragment_capacity``) and ``compressBound`` is zlib's
worst case. Hence fragments never spill into a second packet, whatever the data.
For a 61,706-parameter LeNet-5 this gives 2,464 values (26 fragments) at 32 bits and
9,857 values (7 fragments) at 8 bits, the paper's counts.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from privacy.quantization import dequantize_uint8, stochastic_quantize_uint8

FORMAT_VERSION = 1
ENCODINGS: dict[str, int] = {"float32": 0, "q8": 1}
BYTES_PER_VALUE: dict[str, int] = {"float32": 4, "q8": 1}
_CODES = {v: k for k, v in ENCODINGS.items()}
HEADER = struct.Struct(">BBIIIff")
HEADER_SIZE = HEADER.size  # 22
ZLIB_LEVEL = 6


class InvalidFragment(ValueError):
    """An encoded fragment that cannot be parsed (wrong length, version, encoding or body)."""


def compress_bound(n: int) -> int:
    """zlib's ``compressBound``: the largest output of ``zlib.compress`` for ``n`` input bytes."""
    return n + (n >> 12) + (n >> 14) + (n >> 25) + 13


def values_per_fragment(capacity: int, encoding: str) -> int:
    """Largest value count whose encoded fragment always fits in ``capacity`` bytes."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {sorted(ENCODINGS)}, got {encoding!r}")
    bpv = BYTES_PER_VALUE[encoding]
    if capacity < HEADER_SIZE + compress_bound(bpv):
        raise ValueError(f"capacity must be >= {HEADER_SIZE + compress_bound(bpv)} bytes, got {capacity}")
    n = (capacity - HEADER_SIZE - 13) // bpv
    while HEADER_SIZE + compress_bound(n * bpv) > capacity:
        n -= 1
    return n


@dataclass(frozen=True)
class FragmentLayout:
    """The common index ranges of a vector of ``num_values`` values."""

    num_values: int
    values_per_fragment: int

    def __post_init__(self) -> None:
        if self.num_values < 1 or self.values_per_fragment < 1:
            raise ValueError(f"num_values and values_per_fragment must be >= 1, got "
                             f"{self.num_values}, {self.values_per_fragment}")

    @property
    def count(self) -> int:
        return math.ceil(self.num_values / self.values_per_fragment)

    def range(self, index: int) -> tuple[int, int]:
        if not 0 <= index < self.count:
            raise ValueError(f"fragment index must be in [0, {self.count}), got {index}")
        start = index * self.values_per_fragment
        return start, min(start + self.values_per_fragment, self.num_values)

    def ranges(self) -> list[tuple[int, int]]:
        return [self.range(i) for i in range(self.count)]

    def index_of(self, start: int, stop: int) -> int | None:
        """Fragment index of ``[start, stop)``, or None when it is not one of this layout's ranges."""
        if start % self.values_per_fragment or not 0 <= start < self.num_values:
            return None
        index = start // self.values_per_fragment
        return index if self.range(index) == (start, stop) else None


def layout_for(num_values: int, capacity: int, encoding: str) -> FragmentLayout:
    """The layout of a ``num_values`` vector under ``encoding`` for packets carrying ``capacity`` bytes."""
    return FragmentLayout(num_values, values_per_fragment(capacity, encoding))


@dataclass(frozen=True)
class Fragment:
    """Values ``w[start:start + len(values)]`` of some node's round-``round`` state (no sender)."""

    round: int
    start: int
    values: np.ndarray

    @property
    def stop(self) -> int:
        return self.start + len(self.values)


def split(vector: np.ndarray, layout: FragmentLayout, round_: int) -> list[Fragment]:
    """Cut ``vector`` into the layout's fragments."""
    vector = np.asarray(vector, dtype=np.float32)
    if vector.shape != (layout.num_values,):
        raise ValueError(f"vector must have shape ({layout.num_values},), got {vector.shape}")
    return [Fragment(round_, a, vector[a:b].copy()) for a, b in layout.ranges()]


def reassemble(fragments: list[Fragment], num_values: int) -> tuple[np.ndarray, np.ndarray]:
    """``(vector, covered)``: values placed at their ranges (later fragments win), and the coverage mask."""
    out = np.zeros(num_values, dtype=np.float32)
    covered = np.zeros(num_values, dtype=bool)
    for f in fragments:
        if f.start < 0 or f.stop > num_values:
            raise ValueError(f"fragment [{f.start}, {f.stop}) lies outside [0, {num_values})")
        out[f.start : f.stop] = f.values
        covered[f.start : f.stop] = True
    return out, covered


def encode(fragment: Fragment, encoding: str, rng: np.random.Generator | None = None) -> bytes:
    """Header plus zlib-compressed values (``q8`` needs ``rng`` for the rounding coins)."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {sorted(ENCODINGS)}, got {encoding!r}")
    values = np.asarray(fragment.values)
    if values.ndim != 1 or values.size == 0 or not np.isfinite(values).all():
        raise ValueError("fragment values must be a non-empty 1-D array of finite numbers")
    if encoding == "q8":
        if rng is None:
            raise ValueError("q8 encoding needs an rng for stochastic rounding")
        q, lo, scale = stochastic_quantize_uint8(values, rng)
        raw = q.tobytes()
    else:
        raw, lo, scale = values.astype(">f4").tobytes(), 0.0, 0.0
    head = HEADER.pack(FORMAT_VERSION, ENCODINGS[encoding], fragment.round, fragment.start, values.size, lo, scale)
    return head + zlib.compress(raw, ZLIB_LEVEL)


def decode(data: bytes) -> tuple[Fragment, str]:
    """Parse an encoded fragment; lengths and fields are checked before use.

    Raises
    ------
    InvalidFragment
        Truncated header, unknown version or encoding, a body that is not zlib or
        does not hold exactly ``count`` values, or non-finite values.
    """
    if len(data) < HEADER_SIZE:
        raise InvalidFragment(f"fragment of {len(data)} bytes is shorter than its {HEADER_SIZE}-byte header")
    version, code, round_, start, count, lo, scale = HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        raise InvalidFragment(f"unknown fragment format version {version}")
    if code not in _CODES:
        raise InvalidFragment(f"unknown encoding code {code}")
    encoding = _CODES[code]
    if count < 1:
        raise InvalidFragment("fragment holds no values")
    expected = count * BYTES_PER_VALUE[encoding]
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(data[HEADER_SIZE:], expected + 1)  # bounded: no decompression bombs
    except zlib.error as exc:
        raise InvalidFragment(f"body is not zlib data: {exc}") from exc
    if len(raw) != expected or not inflater.eof:
        raise InvalidFragment(f"body holds {len(raw)} bytes, expected {expected} for {count} values")
    if encoding == "q8":
        if not (math.isfinite(lo) and math.isfinite(scale) and scale >= 0):
            raise InvalidFragment(f"invalid q8 parameters lo={lo}, scale={scale}")
        values = dequantize_uint8(np.frombuffer(raw, dtype=np.uint8), lo, scale)
    else:
        values = np.frombuffer(raw, dtype=">f4").astype(np.float32)
    if not np.isfinite(values).all():
        raise InvalidFragment("fragment values must be finite")
    return Fragment(round_, start, values), encoding
