"""Configuration validation, and round trips of the frame and message encodings."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixnet import wire
from mixnet.config import MixnetConfig
from mixnet.constants import PacketFormat
from mixnet.crypto import SeededRandomSource
from mixnet.errors import InvalidPayload
from mixnet.messages import Ack, DataFragment, decode_message, encode_ack, encode_data, fragment_capacity
from mixnet.peers import PeerInfo
from mixnet.surb import create_surb
from mixnet.testing import SMALL_FORMAT, make_hops, make_keys


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"max_path_length": 0}, "max_path_length"),
        ({"max_path_length": 6}, "header_hops"),
        ({"outbox_size": 0}, "outbox_size"),
        ({"mu": 0.0}, "mu"),
        ({"sigma": -1.0}, "sigma"),
        ({"cover_policy": "some"}, "cover_policy"),
        ({"ack_timeout": 0.0}, "ack_timeout"),
        ({"max_retries": -1}, "max_retries"),
        ({"path_length_weights": (1.0,)}, "path_length_weights"),
        ({"payload_size": 10}, "payload_size"),
        ({"transport": "carrier-pigeon"}, "transport"),
    ],
)
def test_bad_parameters_raise_value_error_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MixnetConfig(**kwargs)


def test_paper_defaults_and_run_config_keys():
    cfg = MixnetConfig()
    assert (cfg.max_path_length, cfg.outbox_size, cfg.mu, cfg.sigma, cfg.cover_traffic) == (2, 100, 0.1, 0.001, True)
    assert cfg.payload_size == 10_240 and cfg.effective_fill_timeout == 0.1
    assert cfg.effective_ack_timeout == pytest.approx(2 * 3 * (0.1 + 0.4) + 0.5)
    cfg2 = MixnetConfig.from_mapping({"max-path-length": 3, "outbox-size": 20, "cover-policy": "all"})
    assert (cfg2.max_path_length, cfg2.outbox_size, cfg2.cover_policy) == (3, 20, "all")
    with pytest.raises(ValueError, match="unknown mixnet config key"):
        MixnetConfig.from_mapping({"hops": 2})


def test_fragment_capacity_hand_computed():
    fmt = PacketFormat()
    assert fragment_capacity(fmt) == 10_240 - 16 - (1 + 16 + 12) - (16 + 253 + 32)


@settings(max_examples=40, deadline=None, database=None)
@given(st.integers(0, 2**40), st.binary(min_size=32, max_size=32), st.text(max_size=40), st.integers(0, 2**64 - 1))
def test_frames_round_trip(node_id, key, endpoint, nonce):
    info = PeerInfo(node_id, key, endpoint)
    assert wire.decode_frame(SMALL_FORMAT, wire.join_frame(info)).peers == (info,)
    assert wire.decode_frame(SMALL_FORMAT, wire.view_frame([info, info])).peers == (info, info)
    assert wire.decode_frame(SMALL_FORMAT, wire.ping_frame(nonce)).nonce == nonce
    assert wire.decode_frame(SMALL_FORMAT, wire.leave_frame(node_id)).node_id == node_id


def test_messages_round_trip_and_reject_inconsistent_fields():
    hops = make_hops(make_keys(2))
    surb, _ = create_surb(SMALL_FORMAT, [hops[1], hops[0]], [0.1], SeededRandomSource(0))
    frag = DataFragment(b"i" * 16, 2, 5, surb, b"chunk")
    assert decode_message(SMALL_FORMAT, encode_data(SMALL_FORMAT, frag)) == frag
    assert decode_message(SMALL_FORMAT, encode_ack(Ack(b"j" * 16, 3))) == Ack(b"j" * 16, 3)
    bad_index = bytearray(encode_data(SMALL_FORMAT, frag))
    bad_index[17:21] = (9).to_bytes(4, "big")  # index 9 of 5 fragments
    with pytest.raises(InvalidPayload, match="index"):
        decode_message(SMALL_FORMAT, bytes(bad_index))
    with pytest.raises(ValueError, match="fragment data"):
        encode_data(SMALL_FORMAT, DataFragment(b"i" * 16, 0, 1, surb, bytes(fragment_capacity(SMALL_FORMAT) + 1)))
