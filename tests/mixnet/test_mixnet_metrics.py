"""Entropy metrics: hand-computed values, an independent density check, a trace diagnostic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from mixnet.config import MixnetConfig
from mixnet.metrics import (
    h_path,
    h_relay,
    hold_time_density,
    relay_linking_accuracy,
    relay_mapping_entropy,
    shannon_entropy,
)
from mixnet.simulator import Simulator
from mixnet.trace import AdversaryView, TraceRecord


def test_paper_entropies_hand_computed():
    assert h_relay(100) == pytest.approx(6.643856, abs=1e-6)
    assert h_path(100, 2) == pytest.approx(math.log2(100 + 100**2))
    assert h_path(100, 1) == pytest.approx(h_relay(100))
    assert h_path(2, 3) == pytest.approx(math.log2(14))
    with pytest.raises(ValueError, match="outbox_size"):
        h_relay(0)
    with pytest.raises(ValueError, match="max_path_length"):
        h_path(10, 0)


def test_shannon_entropy_hand_computed():
    assert shannon_entropy([0.5, 0.25, 0.25]) == pytest.approx(1.5)
    assert shannon_entropy([1, 1, 1, 1]) == pytest.approx(2.0)
    assert shannon_entropy([1.0, 0.0]) == 0.0
    with pytest.raises(ValueError, match="probabilities"):
        shannon_entropy([])


@pytest.mark.parametrize("fill", [0.0, 0.1, 0.5])
def test_hold_time_density_matches_numerical_convolution(fill):
    mu = 0.1
    total, _ = integrate.quad(lambda t: hold_time_density(np.array([t]), mu, fill)[0], 0, fill + 50 * mu, limit=200)
    assert total == pytest.approx(1.0, abs=1e-6)
    for t in (0.05, 0.3, 0.7):
        expected = (stats.expon(scale=mu).pdf(t) if fill == 0 else
                    integrate.quad(lambda w: stats.expon(scale=mu).pdf(t - w) / fill, 0, min(t, fill))[0])  # noqa: B023
        assert hold_time_density(np.array([t]), mu, fill)[0] == pytest.approx(expected, rel=1e-6)


def test_relay_mapping_entropy_hand_computed():
    size = 100
    records = (
        TraceRecord(0.00, 1, 9, size, 0.5),  # two inputs to relay 9
        TraceRecord(0.40, 2, 9, size, 0.9),
        TraceRecord(1.00, 9, 3, size, 1.01),  # one output
        TraceRecord(0.20, 9, 4, 7, 0.21),  # control frame: ignored
    )
    view = AdversaryView(records, size, mu=0.2, fill_timeout=0.0, outbox_size=2, max_path_length=1)
    w = np.exp(-np.array([0.5, 0.1]) / 0.2)
    p = w / w.sum()
    expected = float(-(p * np.log2(p)).sum())
    result = relay_mapping_entropy(view, 9)
    assert result.outputs == 1 and result.mean_candidates == 2
    assert result.mean_bits == pytest.approx(expected)


def test_relay_entropy_on_simulated_trace_is_bounded_and_scored():
    cfg = MixnetConfig(max_path_length=2, outbox_size=6, payload_size=1024, mu=0.1)
    sim = Simulator(cfg, 8, seed=2)
    for i in range(8):
        sim.send(i, (i + 2) % 8, b"u%d" % i)
    sim.run_until_idle()
    view = sim.adversary_view()
    for relay in range(8):
        result = relay_mapping_entropy(view, relay)
        assert result.outputs > 0
        # Per output H <= log2(#candidates); by Jensen the mean stays <= log2(mean #candidates).
        assert 0 < result.mean_bits <= math.log2(result.mean_candidates) + 1e-9
        assert all(b >= 0 for b in result.per_output_bits)
    accuracy, mass, scored = relay_linking_accuracy(view, sim.ground_truth(), 0)
    assert scored > 0 and 0 <= accuracy <= 1 and 0 < mass <= 1
