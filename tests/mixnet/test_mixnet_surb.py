"""Single-Use Reply Blocks: reply round trip, single use, tamper detection, parsing."""

from __future__ import annotations

import pytest

from mixnet.crypto import SeededRandomSource
from mixnet.errors import InvalidPayload, InvalidSURB, ReplayDetected
from mixnet.header import encode_address
from mixnet.packet import Reply
from mixnet.replay import ReplayCache
from mixnet.surb import SURB, SURBGuard, SURBStore, create_surb, reply_packet
from mixnet.testing import SMALL_FORMAT, make_hops, make_keys, walk

KEYS = make_keys(6, seed=3)
HOPS = make_hops(KEYS)
CREATOR = 0


def _surb(seed: int, relays: list[int]):
    route = [HOPS[r] for r in relays] + [HOPS[CREATOR]]
    return create_surb(SMALL_FORMAT, route, [0.1] * len(relays), SeededRandomSource(seed))


@pytest.mark.parametrize("relays", [[], [2], [2, 4], [5, 1, 3]])
def test_reply_reaches_creator_and_opens(relays):
    surb, secret = _surb(1, relays)
    store = SURBStore()
    store.register(secret)
    packet = SURBGuard().use(SMALL_FORMAT, surb, b"ack 42")
    assert len(packet) == SMALL_FORMAT.packet_size
    result, visited, _ = walk(SMALL_FORMAT, KEYS, surb.first_hop, packet)
    assert visited == relays + [CREATOR]
    assert isinstance(result, Reply) and result.surb_id == secret.surb_id
    assert store.open(SMALL_FORMAT, result.surb_id, result.body)[:6] == b"ack 42"


def test_surb_hides_path_length_and_creator():
    sizes = set()
    for relays in ([], [2], [2, 4], [5, 1, 3]):
        surb, _ = _surb(2, relays)
        raw = surb.to_bytes()
        sizes.add(len(raw))
        if relays:  # the replier only learns the first relay, never the creator
            assert surb.first_hop == relays[0]
    assert sizes == {SMALL_FORMAT.surb_size}


def test_surb_cannot_be_used_twice():
    surb, secret = _surb(3, [2, 4])
    store, guard = SURBStore(), SURBGuard()
    store.register(secret)
    guard.use(SMALL_FORMAT, surb, b"first")
    with pytest.raises(InvalidSURB, match="already used"):
        guard.use(SMALL_FORMAT, surb, b"second")


def test_surb_reuse_bypassing_the_guard_is_dropped_as_replay():
    surb, secret = _surb(4, [2, 4])
    caches = {i: ReplayCache() for i in KEYS}
    store = SURBStore()
    store.register(secret)
    result, _, _ = walk(SMALL_FORMAT, KEYS, surb.first_hop, reply_packet(SMALL_FORMAT, surb, b"one"), caches)
    assert store.open(SMALL_FORMAT, result.surb_id, result.body)[:3] == b"one"
    # A second reply on the same SURB (different body) replays the header at the first hop.
    with pytest.raises(ReplayDetected):
        walk(SMALL_FORMAT, KEYS, surb.first_hop, reply_packet(SMALL_FORMAT, surb, b"two"), caches)
    # And the creator would refuse it anyway.
    with pytest.raises(InvalidSURB):
        store.open(SMALL_FORMAT, result.surb_id, result.body)


def test_tampered_reply_is_rejected_and_surb_stays_open():
    surb, secret = _surb(5, [3])
    store = SURBStore()
    store.register(secret)
    packet = bytearray(reply_packet(SMALL_FORMAT, surb, b"ack"))
    packet[-7] ^= 0x20
    result, _, _ = walk(SMALL_FORMAT, KEYS, surb.first_hop, bytes(packet))
    with pytest.raises(InvalidPayload):
        store.open(SMALL_FORMAT, result.surb_id, result.body)
    assert secret.surb_id in store


def test_surb_parsing_checks_length_and_round_trips():
    surb, _ = _surb(6, [1, 2])
    assert SURB.from_bytes(SMALL_FORMAT, surb.to_bytes()) == surb
    for bad in (b"", surb.to_bytes()[:-1], surb.to_bytes() + b"\x00"):
        with pytest.raises(InvalidSURB):
            SURB.from_bytes(SMALL_FORMAT, bad)
    assert surb.to_bytes()[:16] == encode_address(1)
