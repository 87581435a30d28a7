"""Fragmentation, encoding and the 8-bit stochastic quantizer."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from privacy.fragments import (
    HEADER_SIZE,
    FragmentLayout,
    InvalidFragment,
    compress_bound,
    decode,
    encode,
    layout_for,
    reassemble,
    split,
    values_per_fragment,
)
from privacy.quantization import dequantize_uint8, stochastic_quantize_uint8

CAPACITY = 9_894  # application bytes of one Sphinx packet with a 10,240-byte body (mixnet)


def test_packet_capacity_is_what_the_mixnet_carries_in_one_packet():
    from mixnet.constants import PacketFormat
    from mixnet.messages import fragment_capacity

    assert fragment_capacity(PacketFormat(5, 10_240)) == CAPACITY


def test_paper_fragment_counts_for_lenet5():
    # 61,706 LeNet-5 values: 26 fragments at 32 bits and 7 at 8 bits (the paper's counts).
    assert values_per_fragment(CAPACITY, "float32") == 2_464
    assert values_per_fragment(CAPACITY, "q8") == 9_857
    assert layout_for(61_706, CAPACITY, "float32").count == 26
    assert layout_for(61_706, CAPACITY, "q8").count == 7
    # the budget is tight: one more value would not fit in the worst case
    assert HEADER_SIZE + compress_bound(4 * 2_465) > CAPACITY >= HEADER_SIZE + compress_bound(4 * 2_464)


def test_layout_ranges_tile_the_vector():
    lay = FragmentLayout(10, 4)
    assert lay.ranges() == [(0, 4), (4, 8), (8, 10)]
    assert lay.index_of(8, 10) == 2 and lay.index_of(8, 9) is None and lay.index_of(3, 7) is None


@pytest.mark.parametrize("encoding", ["float32", "q8"])
def test_worst_case_data_still_fits_one_packet(encoding, rng):
    n = values_per_fragment(CAPACITY, encoding)
    vals = rng.standard_normal(n).astype(np.float32) * 1e3  # incompressible
    data = encode(split(vals, FragmentLayout(n, n), 3)[0], encoding, rng)
    assert len(data) <= CAPACITY


def test_float32_round_trip_is_exact(rng):
    vec = rng.standard_normal(10_000).astype(np.float32)
    lay = FragmentLayout(len(vec), 3_000)
    frags = [decode(encode(f, "float32"))[0] for f in split(vec, lay, 7)]
    assert [f.round for f in frags] == [7] * 4
    out, covered = reassemble(frags, len(vec))
    assert covered.all() and np.array_equal(out, vec)


def test_q8_round_trip_is_within_one_step(rng):
    vec = rng.standard_normal(5_000).astype(np.float32)
    lay = FragmentLayout(len(vec), 1_000)
    frags = [decode(encode(f, "q8", rng))[0] for f in split(vec, lay, 1)]
    out, covered = reassemble(frags, len(vec))
    for a, b in lay.ranges():
        step = (vec[a:b].max() - vec[a:b].min()) / 255
        assert np.abs(out[a:b] - vec[a:b]).max() <= step * 1.0001
    assert covered.all()


def test_partial_reassembly_reports_coverage():
    frags = split(np.arange(10, dtype=np.float32), FragmentLayout(10, 4), 0)
    out, covered = reassemble([frags[0], frags[2]], 10)
    assert covered.tolist() == [True] * 4 + [False] * 4 + [True] * 2
    assert out[8:].tolist() == [8.0, 9.0]


@pytest.mark.parametrize("mutate, msg", [
    (lambda d: d[:10], "shorter"),
    (lambda d: bytes([9]) + d[1:], "version"),
    (lambda d: d[:1] + bytes([7]) + d[2:], "encoding"),
    (lambda d: d[:HEADER_SIZE] + b"not zlib at all", "zlib"),
    (lambda d: d[:-5], "zlib|holds"),
])
def test_decode_rejects_malformed_fragments(mutate, msg):
    data = encode(split(np.ones(100, dtype=np.float32), FragmentLayout(100, 100), 1)[0], "float32")
    with pytest.raises(InvalidFragment, match=msg):
        decode(mutate(data))


def test_quantizer_is_unbiased_statistically():
    """Mean of many independent quantizations converges to x (z-test), floor rounding would not."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, 400)
    reps = 400
    err = np.stack([dequantize_uint8(*stochastic_quantize_uint8(x, rng)).astype(np.float64) - x for _ in range(reps)])
    step = (x.max() - x.min()) / 255
    # per-value sample means: SD <= step / (2 sqrt(reps)); overall mean: SD <= step / (2 sqrt(reps * n))
    overall = err.mean()
    se = err.std(ddof=1) / np.sqrt(err.size)
    assert abs(overall) < 4 * se, (overall, se)
    assert np.abs(err.mean(axis=0)).max() < 5 * step / (2 * np.sqrt(reps))
    assert np.abs(err).max() <= step * 1.0001
    # the test has power: deterministic floor rounding is biased by about -step / 2
    floor = np.floor((x - x.min()) / step) * step + x.min() - x
    assert abs(floor.mean()) > 20 * se


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.integers(1, 200), elements=st.floats(-1e6, 1e6)), st.integers(0, 2**31))
def test_quantized_values_stay_within_one_step_of_the_input(x, seed):
    q, lo, scale = stochastic_quantize_uint8(x, np.random.default_rng(seed))
    y = dequantize_uint8(q, lo, scale).astype(np.float64)
    tol = scale * 1.0001 + 1e-6 * max(1.0, np.abs(x).max())
    assert np.all(np.abs(y - x) <= tol)
