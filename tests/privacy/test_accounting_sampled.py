"""Accounting with amplification by client sampling (privacy.accounting.account_sampled), against references."""

import math
import warnings

import dp_accounting
import numpy as np
import pytest

from privacy.accounting import (
    account,
    account_sampled,
    event_epsilon,
    poisson_sampled_epsilon,
    sampled_event,
)
from privacy.mechanisms import calibrate_sigma_abs, sensitivity
from privacy.opacus_import import import_opacus

import_opacus()
from opacus.accountants.analysis import rdp as opacus_rdp  # noqa: E402

ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]  # dp-accounting's grid
INT_ORDERS = [float(a) for a in range(2, 64)] + [128.0, 256.0]


@pytest.mark.parametrize("q,z,steps", [(0.01, 1.1, 1000), (0.1, 2.4224, 100), (0.3, 1.5, 20), (0.5, 4.0, 50)])
def test_poisson_epsilon_matches_opacus_independent_rdp(q, z, steps):
    """Opacus' own sampled-Gaussian RDP (a separate implementation) through its own RDP->DP conversion."""
    delta = 1e-5
    event = sampled_event("poisson", q, 100, z, steps)

    def opacus_eps(orders: list[float]) -> float:
        rdp = opacus_rdp.compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=orders)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Opacus warns when the optimum is at the grid's edge
            return float(opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0])

    # integer orders: both libraries evaluate the same closed-form sum, so they agree to rounding
    acc = dp_accounting.rdp.RdpAccountant(orders=INT_ORDERS)
    acc.compose(event)
    assert acc.get_epsilon(delta) == pytest.approx(opacus_eps(INT_ORDERS), rel=1e-9)
    # the full grid: dp-accounting leaves out fractional orders whose series does not converge, so it may be
    # (slightly) looser than Opacus, never tighter
    eps = event_epsilon(event, "add-remove", delta)[0]
    ref = opacus_eps(ORDERS)
    assert ref * (1 - 1e-9) <= eps <= acc.get_epsilon(delta) and eps == pytest.approx(ref, rel=2e-3)
    assert poisson_sampled_epsilon(q, [z] * steps, delta) == pytest.approx(eps, rel=1e-9)


def test_without_replacement_order_2_matches_wang_balle_kasiviswanathan_by_hand():
    """Order 2 of Wang, Balle & Kasiviswanathan (AISTATS 2019), Thm. 9 for the Gaussian (eps(inf) = inf):
    A_2 = 1 + gamma^2 min(4 (e^{eps(2)} - 1), 2 e^{eps(2)}), eps(2) = 1 / z^2; RDP(2) = ln A_2."""
    n, m, z, delta = 50, 10, 1.3, 1e-5
    gamma, e2 = m / n, 1 / z ** 2
    rdp2 = math.log(1 + gamma ** 2 * min(4 * math.expm1(e2), 2 * math.exp(e2)))
    acc = dp_accounting.rdp.RdpAccountant(orders=[2.0], neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, m, dp_accounting.GaussianDpEvent(z)))
    eps = acc.get_epsilon(delta)
    # dp-accounting's conversion at one order (Balle et al. 2020, Prop. 12): eps = r + ln(1 - 1/a) - ln(delta a)/(a - 1)
    assert eps == pytest.approx(rdp2 + math.log1p(-1 / 2) - math.log(delta * 2), rel=1e-9)


@pytest.mark.parametrize("framework", ["fl", "sequential-dfl"])
def test_full_participation_reproduces_todays_ledger_exactly(framework):
    full = account(framework, 1.0, 2.0, 100, 20)
    fixed = account_sampled(framework, 1.0, 2.0, 100, 20, fraction=1.0, scheme="fixed")
    # fixed size at q = 1 is the replace-one ledger of today, bit for bit
    assert fixed.sigma_abs == full.sigma_abs and fixed.sensitivity == full.sensitivity
    assert fixed.noise_multiplier == full.noise_multiplier
    assert fixed.eps_amplified == fixed.eps_unamplified == fixed.eps_total == full.eps_rdp_accountant
    # Poisson at q = 1: the same noise, its (add/remove) unsampled epsilon
    poisson = account_sampled(framework, 1.0, 2.0, 100, 20, fraction=1.0, scheme="poisson")
    assert poisson.sigma_abs == full.sigma_abs and poisson.neighbouring == "add-remove"
    z_ar = full.sigma_abs / sensitivity(framework, 1.0, 100, "add-remove")
    ref = event_epsilon(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z_ar), 20), "add-remove",
                        1e-5)[0]
    assert poisson.eps_amplified == poisson.eps_unamplified == ref


@pytest.mark.parametrize("scheme", ["poisson", "fixed"])
@pytest.mark.parametrize("framework", ["fl", "sequential-dfl"])
def test_epsilon_decreases_with_q(scheme, framework):
    fractions = [1.0, 0.8, 0.5, 0.3, 0.1, 0.05]
    rows = [account_sampled(framework, 1.0, 2.0, 100, 20, fraction=q, scheme=scheme) for q in fractions]
    eps = [r.eps_total for r in rows]
    assert all(a >= b for a, b in zip(eps, eps[1:])), eps
    assert eps[-1] < eps[0] / 2  # amplification at q = 0.05 is substantial
    assert all(r.eps_total == min(r.eps_amplified, r.eps_unamplified) for r in rows)
    if scheme == "poisson" and framework == "fl":  # the Poisson accountant is monotone on its own
        amp = [r.eps_amplified for r in rows]
        assert all(a > b for a, b in zip(amp, amp[1:]))


def test_sampled_sigma_and_sensitivity_follow_the_cohort():
    p = account_sampled("fl", 1.0, 2.0, 100, 20, fraction=0.1, scheme="poisson")
    assert p.cohort == pytest.approx(10.0) and p.sigma_abs == pytest.approx(calibrate_sigma_abs(1.0, 10, 2.0))
    assert p.sensitivity == pytest.approx(1.0 / 10)  # add/remove: C / (q N)
    f = account_sampled("fl", 1.0, 2.0, 100, 20, fraction=0.25, scheme="fixed")
    assert f.cohort == 25 and f.sensitivity == pytest.approx(2.0 / 25) and f.neighbouring == "replace-one"
    # the noise multiplier does not move with q (eps_cal calibrates one round before amplification)
    assert p.noise_multiplier == pytest.approx(account_sampled("fl", 1.0, 2.0, 100, 20, 1e-5, 1e-5, 0.5).noise_multiplier)
    d = account_sampled("sequential-dfl", 1.0, 2.0, 100, 20, fraction=0.1, scheme="poisson")
    assert d.sensitivity == 2.0 and d.sigma_abs == p.sigma_abs  # matched: DFL gets FL's noise, its sensitivity 2C


def test_the_accountant_refuses_an_event_under_the_wrong_relation_and_bad_input():
    z = 1.0
    with pytest.raises(ValueError, match="cannot account"):
        event_epsilon(sampled_event("poisson", 0.5, 10, z, 3), "replace-one", 1e-5)
    with pytest.raises(ValueError, match="cannot account"):
        event_epsilon(sampled_event("fixed", 0.5, 10, z, 3), "add-remove", 1e-5)
    with pytest.raises(ValueError, match="rounds to 0"):
        sampled_event("fixed", 0.01, 10, z, 3)
    with pytest.raises(ValueError, match="client fraction"):
        account_sampled("fl", 1.0, 2.0, 10, 3, fraction=1.5)
    with pytest.raises(ValueError, match="sampling scheme"):
        account_sampled("fl", 1.0, 2.0, 10, 3, fraction=0.5, scheme="bernoulli")
    with pytest.raises(ValueError, match="relation"):
        sensitivity("fl", 1.0, 10, "replace-two")


def test_per_release_ledger_composes_like_the_constant_one():
    """The audit's ledger (one z per release) equals the configured one when every release has the same z."""
    row = account_sampled("fl", 1.0, 2.0, 20, 5, fraction=0.3, scheme="poisson")
    assert poisson_sampled_epsilon(0.3, [row.noise_multiplier] * 5, 1e-5) == pytest.approx(row.eps_amplified, rel=1e-12)
    more = poisson_sampled_epsilon(0.3, [row.noise_multiplier] * 4 + [row.noise_multiplier / 2], 1e-5)
    assert more > row.eps_amplified  # a release with half the noise costs more
    assert np.isfinite(more)
