"""Hypothesis fuzzing of every parser of untrusted bytes: only typed errors, never a crash."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mixnet import wire
from mixnet.crypto import SeededRandomSource
from mixnet.errors import InvalidFrame, MixnetError
from mixnet.messages import decode_message
from mixnet.packet import Deliver, Forward, create_packet, process_packet
from mixnet.replay import ReplayCache
from mixnet.surb import SURB
from mixnet.testing import SMALL_FORMAT, make_hops, make_keys

KEYS = make_keys(3, seed=8)
HOPS = make_hops(KEYS)
VALID = create_packet(SMALL_FORMAT, [HOPS[1], HOPS[2]], [0.1], b"payload", SeededRandomSource(1))
FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=2 * SMALL_FORMAT.packet_size))
def test_packet_parser_on_arbitrary_bytes(raw):
    try:
        result = process_packet(SMALL_FORMAT, KEYS[1], raw, ReplayCache())
    except MixnetError:
        return
    raise AssertionError(f"random bytes were accepted as {type(result).__name__}")


@FUZZ
@given(st.binary(min_size=SMALL_FORMAT.packet_size, max_size=SMALL_FORMAT.packet_size))
def test_packet_parser_on_right_length_garbage(raw):
    try:
        process_packet(SMALL_FORMAT, KEYS[1], raw, ReplayCache())
    except MixnetError:
        return
    raise AssertionError("right-length garbage passed the header MAC")


@FUZZ
@given(st.lists(st.tuples(st.integers(0, SMALL_FORMAT.packet_size - 1), st.integers(1, 255)), min_size=1, max_size=8))
def test_mutated_valid_packet_never_delivers(edits):
    raw = bytearray(VALID)
    for pos, mask in edits:
        raw[pos] ^= mask
    try:
        hop1 = process_packet(SMALL_FORMAT, KEYS[1], bytes(raw), ReplayCache())
        assert isinstance(hop1, Forward)
        final = process_packet(SMALL_FORMAT, KEYS[hop1.next_hop], hop1.packet, ReplayCache())
    except MixnetError:
        return
    assert bytes(raw) == VALID and isinstance(final, Deliver)  # only the identity edit may pass


@FUZZ
@given(st.binary(max_size=3000))
def test_frame_parser(raw):
    try:
        wire.decode_frame(SMALL_FORMAT, raw)
    except InvalidFrame:
        pass


@FUZZ
@given(st.integers(0, 6), st.binary(max_size=600))
def test_frame_parser_with_valid_type_byte(kind, body):
    try:
        frame = wire.decode_frame(SMALL_FORMAT, bytes([kind]) + body)
    except InvalidFrame:
        return
    assert frame.kind == kind


@FUZZ
@given(st.binary(max_size=SMALL_FORMAT.plaintext_size))
def test_message_and_surb_parsers(raw):
    try:
        decode_message(SMALL_FORMAT, raw)
    except MixnetError:
        pass
    try:
        SURB.from_bytes(SMALL_FORMAT, raw)
    except MixnetError:
        pass
