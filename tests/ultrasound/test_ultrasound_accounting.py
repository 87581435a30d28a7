"""DP-SGD accounting: dp-accounting's RDP accountant vs Opacus' independent RDP analysis, the paper's estimate."""

from __future__ import annotations

import math

import pytest
from opacus.accountants.analysis import rdp as opacus_rdp

from privacy.dpsgd import DpSgdEvent, DpSgdLedger, paper_sqrt_t_bound, rdp_epsilon

ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512]


@pytest.mark.parametrize("z,q,steps", [(2.0, 32 / 78, 300), (1.0, 0.05, 1000), (0.8, 0.1, 50), (3.0, 1.0, 10)])
def test_rdp_epsilon_matches_opacus_analysis(z, q, steps):
    """Independent implementation: Opacus' compute_rdp + get_privacy_spent on the same orders."""
    rdp = opacus_rdp.compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=ORDERS)
    eps_opacus, _ = opacus_rdp.get_privacy_spent(orders=ORDERS, rdp=rdp, delta=1e-5)
    eps = rdp_epsilon([DpSgdEvent(z, q, steps)], 1e-5)
    assert eps == pytest.approx(eps_opacus, rel=0.03)


def test_full_batch_gaussian_golden_value():
    """q = 1, one step, z = 1: the Gaussian mechanism. Golden: 4.7285 (RDP, checked against Opacus above);
    the exact value (PLD accountant, an independent method) is 4.3772 and RDP may only be looser."""
    import dp_accounting

    eps = rdp_epsilon([DpSgdEvent(1.0, 1.0, 1)], 1e-5)
    assert eps == pytest.approx(4.7285, abs=1e-3)
    exact = dp_accounting.pld.PLDAccountant().compose(dp_accounting.GaussianDpEvent(1.0)).get_epsilon(1e-5)
    assert exact == pytest.approx(4.3772, abs=1e-3) and exact < eps < 1.15 * exact


def test_monotonic_in_noise_steps_and_rate():
    base = rdp_epsilon([DpSgdEvent(2.0, 0.1, 500)], 1e-5)
    assert rdp_epsilon([DpSgdEvent(3.0, 0.1, 500)], 1e-5) < base
    assert rdp_epsilon([DpSgdEvent(2.0, 0.1, 1000)], 1e-5) > base
    assert rdp_epsilon([DpSgdEvent(2.0, 0.2, 500)], 1e-5) > base
    assert rdp_epsilon([DpSgdEvent(0.0, 0.1, 5)], 1e-5) == math.inf
    assert rdp_epsilon([], 1e-5) == 0.0


def test_ledger_composition_equals_one_event():
    led = DpSgdLedger()
    for _ in range(4):
        led.record(2.0, 0.25, 25)
    led.record(2.0, 0.25, 0)  # nothing happened: not recorded
    assert led.total_steps == 100 and len(led.events) == 4
    assert rdp_epsilon(led.events, 1e-5) == pytest.approx(rdp_epsilon([DpSgdEvent(2.0, 0.25, 100)], 1e-5), rel=1e-9)
    with pytest.raises(ValueError, match="sample_rate"):
        led.record(2.0, 0.0, 1)


def test_heterogeneous_ledger_matches_opacus_rdp_sum():
    events = [DpSgdEvent(2.0, 0.1, 100), DpSgdEvent(2.0, 0.2, 50), DpSgdEvent(1.5, 0.1, 20)]
    rdp = sum(opacus_rdp.compute_rdp(q=e.sample_rate, noise_multiplier=e.noise_multiplier, steps=e.steps,
                                     orders=ORDERS) for e in events)
    eps_opacus, _ = opacus_rdp.get_privacy_spent(orders=ORDERS, rdp=rdp, delta=1e-5)
    assert rdp_epsilon(events, 1e-5) == pytest.approx(eps_opacus, rel=0.03)
    assert rdp_epsilon(events, 1e-5) > rdp_epsilon(events[:2], 1e-5)


def test_paper_sqrt_t_estimate_hand_values():
    # sqrt(100) * sqrt(2 ln(1.25e5)) / 2 = 10 * 4.84478 / 2
    assert paper_sqrt_t_bound(2.0, 100, 1e-5) == pytest.approx(24.2239, rel=1e-4)
    # the paper's "about 270 for z = 2" corresponds to about 12,400 DP-SGD steps
    assert paper_sqrt_t_bound(2.0, 12_420, 1e-5) == pytest.approx(270, rel=0.01)
    assert paper_sqrt_t_bound(0.0, 10, 1e-5) == math.inf
    # the accountant is far tighter than the estimate for subsampled steps
    assert rdp_epsilon([DpSgdEvent(2.0, 32 / 1585, 12_420)], 1e-5) < 10
