"""Client-level privacy accounting for the matched-perturbation releases.

One round releases w(t+1) = f(data) + z with z ~ N(0, sigma_abs^2 I) and replace-one L2
sensitivity Delta (2C/N for FL, 2C for sequential DFL; privacy.mechanisms.sensitivity).
Over T rounds (full participation, no subsampling) that is T compositions of the Gaussian
mechanism with noise multiplier z = sigma_abs / Delta.

Three epsilons are reported, each from a library or from exact algebra (no hand-written
optimizer):

``eps_total`` (the seed paper's "standard conversion")
    eps = min_{alpha > 1} [T * alpha / (2 z^2) + ln(1/delta) / (alpha - 1)]. The Gaussian RDP
    curve is Opacus' ``compute_rdp``; the minimum over alpha is the exact stationary point
    alpha* = 1 + sqrt(ln(1/delta) / rho), rho = T / (2 z^2), giving rho + 2 sqrt(rho ln(1/delta)).
``eps_rdp_accountant`` (tighter, labelled)
    Google dp-accounting's ``RdpAccountant`` on ``SelfComposedDpEvent(GaussianDpEvent(z), T)``,
    which uses the improved RDP-to-DP conversion over its order grid. When the best order sits
    at the grid's edge (tiny z, as for DFL) the value is looser than ``eps_total``; the row says so.
``eps_gdp_exact`` (tightest, labelled)
    The T-fold composition of Gaussians is exactly mu-GDP with mu = sqrt(T) / z (Dong, Roth &
    Su 2022); Opacus' ``eps_from_mu`` inverts its delta(eps) curve. ``None`` where eps > 500
    (outside Opacus' root bracket; such budgets give no meaningful protection anyway).

Client sampling (privacy/sampling.py): with a fraction q < 1 of the clients per round the T releases
are amplified by sampling, *against an adversary who sees the released models but not which clients
were sampled*. :func:`account_sampled` gives that run's ledger: the amplified epsilon of dp-accounting's
``RdpAccountant`` on ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), T)`` (Poisson,
add/remove adjacency, sensitivity C/(qN) of DP-FedAvg's fixed-denominator mean) or on
``SelfComposedDpEvent(SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z)), T)`` (fixed size
m = round(qN), replace-one adjacency, sensitivity 2C/m), beside the unamplified epsilon of the same
noise multiplier and relation (the same event with q = 1). The accountant refuses any other pairing
of event and relation, and so does this module. The run reports ``eps_total`` = the smaller of the two:
both are upper bounds, and sampling never weakens the guarantee (coupling the two runs' draws, each
sampled release is the unsampled release on a neighbouring or an identical pair of cohorts); the
without-replacement bound (Wang, Balle & Kasiviswanathan 2019, Thm. 27) is looser than no
amplification at small noise multipliers, and the row says which bound it reports. At q = 1 nothing is
sampled and the run's ledger is :func:`account`'s.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import dp_accounting

from privacy.opacus_import import import_opacus

import_opacus()  # before any opacus import: no root log handler (see privacy/opacus_import.py)

from opacus.accountants.analysis import gdp as opacus_gdp  # noqa: E402
from opacus.accountants.analysis import rdp as opacus_rdp  # noqa: E402

from privacy.mechanisms import calibrate_sigma_abs, sensitivity  # noqa: E402
from privacy.sampling import RELATION, SCHEMES, expected_cohort, fixed_cohort_size  # noqa: E402

PAPER_CLIP_NORMS = (0.1, 0.5, 1.0, 2.0)
PAPER_EPS_CAL = (0.5, 1.0, 2.0, 3.0, 4.0)
FRAMEWORKS = ("fl", "sequential-dfl")


def rdp_standard_epsilon(noise_multiplier: float, num_rounds: int, delta: float) -> tuple[float, float]:
    """Standard RDP->DP conversion of T Gaussian releases; returns (eps, alpha*)."""
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be >= 1, got {num_rounds}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    log_inv_delta = math.log(1.0 / delta)
    # Opacus' Gaussian RDP at order 2 (q = 1) gives rho: eps_RDP(alpha) = rho * alpha, linear in alpha.
    rdp_at_2 = float(opacus_rdp.compute_rdp(q=1.0, noise_multiplier=noise_multiplier, steps=num_rounds, orders=[2.0])[0])
    rho = rdp_at_2 / 2.0
    alpha = 1.0 + math.sqrt(log_inv_delta / rho)
    return rho * alpha + log_inv_delta / (alpha - 1.0), alpha


def rdp_accountant_epsilon(noise_multiplier: float, num_rounds: int, delta: float) -> tuple[float, bool]:
    """dp-accounting RdpAccountant epsilon; also whether the optimal order hit the grid edge."""
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise_multiplier), num_rounds))
    eps, order = acc.get_epsilon_and_optimal_order(delta)
    return float(eps), bool(order <= min(acc._orders))  # grid edge check


def gdp_exact_epsilon(noise_multiplier: float, num_rounds: int, delta: float) -> float | None:
    """Exact eps of T-fold Gaussian composition (mu-GDP), None when above Opacus' bracket."""
    mu = math.sqrt(num_rounds) / noise_multiplier
    try:
        return float(opacus_gdp.eps_from_mu(mu=mu, delta=delta))
    except ValueError:
        return None


@dataclass(frozen=True)
class AccountingRow:
    """One (framework, C, eps_cal) configuration's privacy ledger."""

    framework: str
    clip_norm: float
    eps_cal: float
    num_clients: int
    num_rounds: int
    delta_cal: float
    sigma_abs: float
    sensitivity: float
    noise_multiplier: float
    eps_total: float
    delta_total: float
    alpha_opt: float
    eps_rdp_accountant: float
    rdp_order_at_grid_edge: bool
    eps_gdp_exact: float | None


def account(
    framework: str, clip_norm: float, eps_cal: float, num_clients: int, num_rounds: int,
    delta_cal: float = 1e-5, delta_total: float = 1e-5,
) -> AccountingRow:
    """Privacy ledger of one configuration."""
    sigma_abs = calibrate_sigma_abs(clip_norm, num_clients, eps_cal, delta_cal)
    sens = sensitivity(framework, clip_norm, num_clients)
    z = sigma_abs / sens
    eps_std, alpha = rdp_standard_epsilon(z, num_rounds, delta_total)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps_acc, edge = rdp_accountant_epsilon(z, num_rounds, delta_total)
    return AccountingRow(framework, clip_norm, eps_cal, num_clients, num_rounds, delta_cal, sigma_abs, sens, z,
                         eps_std, delta_total, alpha, eps_acc, edge, gdp_exact_epsilon(z, num_rounds, delta_total))


_NEIGHBOURING = {"add-remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                 "replace-one": dp_accounting.NeighboringRelation.REPLACE_ONE}


def sampled_event(scheme: str, fraction: float, population: int, noise_multiplier: float,
                  num_rounds: int) -> dp_accounting.DpEvent:
    """T rounds of a Gaussian release (noise multiplier z) on a sampled cohort, as a dp-accounting event.

    ``poisson``: ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``; ``fixed``:
    ``SampledWithoutReplacementDpEvent(N, round(q N), GaussianDpEvent(z))``; composed ``num_rounds`` times.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"sampling scheme must be one of {SCHEMES}, got {scheme!r}")
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be >= 1, got {num_rounds}")
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    if scheme == "poisson":
        expected_cohort(scheme, fraction, population)  # validates q
        one = dp_accounting.PoissonSampledDpEvent(fraction, gaussian)
    else:
        one = dp_accounting.SampledWithoutReplacementDpEvent(population, fixed_cohort_size(fraction, population),
                                                             gaussian)
    return dp_accounting.SelfComposedDpEvent(one, num_rounds)


def event_epsilon(event: dp_accounting.DpEvent, relation: str, delta: float) -> tuple[float, bool]:
    """dp-accounting ``RdpAccountant`` epsilon of ``event`` under ``relation`` ("add-remove" or "replace-one"),
    and whether the optimal order hit the grid's lower edge. The accountant refuses (ValueError here) an event
    it cannot account for under that relation rather than approximating."""
    if relation not in _NEIGHBOURING:
        raise ValueError(f"relation must be one of {sorted(_NEIGHBOURING)}, got {relation!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=_NEIGHBOURING[relation])
    if not acc.supports(event):
        raise ValueError(f"dp-accounting's RDP accountant cannot account for {event} under {relation} adjacency")
    with _quiet_absl():
        acc.compose(event)
    eps, order = acc.get_epsilon_and_optimal_order(delta)
    return float(eps), bool(order <= min(acc._orders))


@contextmanager
def _quiet_absl() -> Iterator[None]:
    """dp-accounting logs (absl, WARNING) each fractional order whose Poisson series does not converge and
    leaves it out of the minimum (a looser, still valid bound); one run would log dozens. Errors still show."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def poisson_sampled_epsilon(fraction: float, noise_multipliers: list[float], delta: float) -> float:
    """Epsilon (add/remove, RDP accountant) of releases with per-release noise multipliers ``noise_multipliers``,
    each on a Poisson-sampled cohort with probability ``fraction`` (the audit's per-round ledger)."""
    if not noise_multipliers:
        raise ValueError("need at least one release")
    expected_cohort("poisson", fraction, 1)  # validates q
    counts: dict[float, int] = {}
    for z in noise_multipliers:  # releases of equal z self-compose (one RDP evaluation each, not one per round)
        counts[float(z)] = counts.get(float(z), 0) + 1
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(fraction,
                                                                                   dp_accounting.GaussianDpEvent(z)), n)
              for z, n in counts.items()]
    return event_epsilon(dp_accounting.ComposedDpEvent(events), "add-remove", delta)[0]


@dataclass(frozen=True)
class SampledAccountingRow:
    """One configuration's ledger under client sampling: amplified and unamplified epsilon, same relation.

    ``cohort`` is what the release is normalised by and its noise sized for (q N, or round(q N));
    ``neighbouring`` the relation every epsilon holds under (privacy.sampling.RELATION); ``eps_total`` the
    run's epsilon, min(eps_amplified, eps_unamplified), and ``eps_total_bound`` which of them it is.
    """

    framework: str
    client_sampling: str
    client_fraction: float
    population: int
    cohort: float
    neighbouring: str
    clip_norm: float
    eps_cal: float
    num_rounds: int
    delta_cal: float
    delta_total: float
    sigma_abs: float
    sensitivity: float
    noise_multiplier: float
    eps_amplified: float
    eps_unamplified: float
    eps_total: float
    eps_total_bound: str
    rdp_order_at_grid_edge: bool


def account_sampled(
    framework: str, clip_norm: float, eps_cal: float, num_clients: int, num_rounds: int,
    delta_cal: float = 1e-5, delta_total: float = 1e-5, fraction: float = 1.0, scheme: str = "poisson",
) -> SampledAccountingRow:
    """Privacy ledger of one configuration whose rounds each sample a fraction ``fraction`` of ``num_clients``.

    sigma_abs is calibrated to the cohort the release divides by (q N or round(q N); privacy.mechanisms),
    z = sigma_abs / sensitivity under the scheme's relation, and the T sampled rounds are accounted by
    dp-accounting (module doc). ``eps_unamplified``: the same z and relation without sampling.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    cohort = expected_cohort(scheme, fraction, num_clients)
    relation = RELATION[scheme]
    sigma_abs = calibrate_sigma_abs(clip_norm, cohort, eps_cal, delta_cal)
    sens = sensitivity(framework, clip_norm, cohort, relation)
    z = sigma_abs / sens
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps_amp, edge = event_epsilon(sampled_event(scheme, fraction, num_clients, z, num_rounds), relation,
                                      delta_total)
        eps_full, _ = event_epsilon(sampled_event(scheme, 1.0, num_clients, z, num_rounds), relation, delta_total)
    bound = "amplified" if eps_amp <= eps_full else "unamplified"
    return SampledAccountingRow(framework, scheme, float(fraction), num_clients, cohort, relation, clip_norm, eps_cal,
                                num_rounds, delta_cal, delta_total, sigma_abs, sens, z, eps_amp, eps_full,
                                min(eps_amp, eps_full), bound, edge)


def grid_table(
    clip_norms=PAPER_CLIP_NORMS, eps_cals=PAPER_EPS_CAL, num_clients: int = 100, num_rounds: int = 100,
    delta_cal: float = 1e-5, delta_total: float = 1e-5, frameworks=FRAMEWORKS,
) -> list[AccountingRow]:
    """The ledger for the whole grid and both frameworks."""
    return [account(f, c, e, num_clients, num_rounds, delta_cal, delta_total)
            for f in frameworks for c in clip_norms for e in eps_cals]


def _markdown(rows: list[AccountingRow]) -> str:
    head = ("| framework | C | eps_cal | sigma_abs | sensitivity | z | eps_total (std RDP) | eps (dp-accounting RDP) "
            "| eps (exact GDP) |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        gdp = "> 500" if r.eps_gdp_exact is None else f"{r.eps_gdp_exact:.4g}"
        edge = " (grid edge)" if r.rdp_order_at_grid_edge else ""
        lines.append(f"| {r.framework} | {r.clip_norm:g} | {r.eps_cal:g} | {r.sigma_abs:.4g} | {r.sensitivity:.4g} | "
                     f"{r.noise_multiplier:.4g} | {r.eps_total:.4g} | {r.eps_rdp_accountant:.4g}{edge} | {gdp} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: print the (eps_total, delta_total) table for the grid."""
    p = argparse.ArgumentParser(prog="python -m privacy.accounting", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a Markdown table")
    p.add_argument("--num-clients", "-N", type=int, default=100)
    p.add_argument("--num-rounds", "-T", type=int, default=100)
    p.add_argument("--delta-cal", type=float, default=1e-5)
    p.add_argument("--delta-total", type=float, default=1e-5)
    p.add_argument("--clip-norms", type=float, nargs="+", default=list(PAPER_CLIP_NORMS))
    p.add_argument("--eps-cal", type=float, nargs="+", default=list(PAPER_EPS_CAL))
    p.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    a = p.parse_args(argv)
    if a.num_clients < 2:
        p.error(f"--num-clients must be >= 2, got {a.num_clients}")
    if a.num_rounds < 1:
        p.error(f"--num-rounds must be >= 1, got {a.num_rounds}")
    for name, val in (("--delta-cal", a.delta_cal), ("--delta-total", a.delta_total)):
        if not 0 < val < 1:
            p.error(f"{name} must be in (0, 1), got {val}")
    for c in a.clip_norms:
        if not c > 0:
            p.error(f"--clip-norms must be > 0, got {c}")
    for e in a.eps_cal:
        if not e > 0:
            p.error(f"--eps-cal must be > 0, got {e}")
    rows = grid_table(a.clip_norms, a.eps_cal, a.num_clients, a.num_rounds, a.delta_cal, a.delta_total, a.frameworks)
    if a.json:
        json.dump([asdict(r) for r in rows], sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(_markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
