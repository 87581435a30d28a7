"""tabular-pdp's audit verdict (issue 37): per DP setting and client group, tests against the configuration.

References, never what the mechanism reports: each release's noise SD from the run's plan, i.e. C
(fixed, or the server's estimate made before the DP phase), n_eps, the clients the base FedAvg
aggregated that round (planned cohort members whose replies arrived: ``CohortFedAvg.contributors``,
recorded by the aggregation, not by the DP wrapper), their committed sizes and ARIREC risks and the
inserted canaries (weights, risks), through the study's own calibration
(privacy.personalized.gdp_sigma / personalized_sigmas). Tests (privacy.audit.verdict):

* group ``all`` (every client's canaries pooled): ``reported-sigma`` (the release SD the mechanism
  reports vs configured), ``measured-noise`` (all held-out canary directions), ``separation`` and
  ``lower-bound`` against the largest per-client formal mu / epsilon (a pooled test of canaries with
  different mu_g has separation <= max mu_g), ``canary-signal`` (below); PDP: ``member-noise`` of
  every client's canaries, each against its own sigma_g;
* each client g (its own canaries): ``measured-noise`` (its held-out directions), ``separation`` vs
  mu_g, ``lower-bound`` vs eps_g; under PDP also ``reported-sigma`` (sigma_g reported vs configured)
  and ``member-noise``: the noised updates of the canaries standing for g, as the trusted server
  holds them, along g's held-out directions, against the configured sigma_g. PDP's personalization
  only shows there: one client's sigma_g / 10 moves the release's SD by a few percent.

Statistic of the separation and lower-bound tests: each canary's projections on the releases, in units
of the configured SD and weighted by its formal signal-to-noise r_t = p_g C / sigma_t per release,
s_k = sum_t r_t proj_{k,t} / sigma_t / sqrt(sum_t r_t^2): for a correct mechanism an inserted canary's
mean is mu_g (its clipped signal p_g C) and the SD 1, the Neyman-Pearson statistic of the composed
Gaussian mechanism. Unlike the cosines of Andrew et al. (kept for the point estimate and the table), it
does not shrink when the clients' own updates dominate the release (n_eps = 0.05: the cosine's
separation is a quarter of the formal mu, and a skipped clip *lowers* it); the clients' updates along
a random direction only add spread (separation <= mu_g: the test stays valid).

``canary-signal`` (every group): the same scores, inserted minus held-out mean, against the formal
signal itself (Welch t, one-sided): the configured SD is the unit, so a correct clip gives exactly
mu_g on average whatever the clients' updates add (they add spread, zero mean along a random
direction), while a canary let in unclipped (at 2C-10C) gives 2-10 mu_g (the power is computed
against the canaries' own norms: the signal they would carry unclipped). The test the clip bugs meet
at n_eps = 0.05, where the pooled-SD separation loses three quarters of its power to the clients' updates.

Honest power: a test is counted as powered only where the data allow it. The noise test's power
against half the noise is computed with the release's signal energy estimated from the ratio measured
on every held-out direction (r^2 - 1 per coordinate, which a too-small noise would hide behind); the separation
test's power against twice the formal mu is scaled by the statistic's measured efficiency mu_hat / mu_formal (at most 1).

Verdict per group: ``violation`` when a test fires; ``consistent`` only when both bug classes had a
powered test, the noise scale (measured-noise, member-noise, separation) and the clip (canary-signal,
separation); else ``underpowered``, naming the class that had none (``unpowered``).

Family-wise error: ALPHA over the whole run (Bonferroni): ALPHA / settings per setting, split equally
over its groups, then over each group's statistical tests (the reported-sigma test is exact). The
setting's verdict is the worst of its groups' and the run's the worst of its settings' (violation >
underpowered > consistent): a run is consistent only when every audited setting is shown to be.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
from scipy import stats

from privacy.audit import CanarySet, ReleaseObserver, gdp_epsilon
from privacy.audit.verdict import POWER, bound_test, decide, noise_test, reported_sigma_test, separation_test
from privacy.personalized import gdp_sigma, personalized_sigmas
from strategies.canaries import WeightedCanaries

SEVERITY = {"consistent": 0, "underpowered": 1, "violation": 2}
#: the bug classes a consistent verdict must have covered, and the tests that can cover each
CLASSES = {"noise scale": ("measured-noise", "member-noise", "separation"), "clip": ("canary-signal", "separation")}


def worst(verdicts: list[str]) -> str:
    """The run's (or setting's) verdict from its parts: violation > underpowered > consistent."""
    if not verdicts:
        return "underpowered"
    return max(verdicts, key=lambda v: SEVERITY[v])


@dataclass(frozen=True)
class ReleasePlan:
    """What the configuration says about one release (one round)."""

    sd: float  # the noise SD on the released aggregate
    share: dict[int, float]  # client group -> p_g, a canary's FedAvg weight over the round's total weight
    member_sd: dict[int, float]  # PDP: client group -> sigma_g of a member with that client's risk


def configured_releases(setting: str, noise_multiplier: float, clip_norm: float,
                        contributors: dict[int, list[int]], sizes: dict[int, int], risks: dict[int, float],
                        weighted: WeightedCanaries) -> dict[int, ReleasePlan]:
    """Round -> the configured release (every round in which some planned client was aggregated)."""
    w_can = float(weighted.weights.sum())
    groups = sorted({int(g) for g in weighted.groups})
    out: dict[int, ReleasePlan] = {}
    for r, cohort in sorted(contributors.items()):
        if not cohort:
            continue
        total = sum(float(sizes[c]) for c in cohort) + w_can
        share = {g: float(sizes[g]) / total for g in groups}
        if setting == "gdp":
            out[r] = ReleasePlan(gdp_sigma(noise_multiplier, clip_norm, len(cohort) + weighted.num_inserted),
                                 share, {})
            continue
        member_risks = [risks[c] for c in cohort] + [risks[int(g)] for g in weighted.groups]
        s = personalized_sigmas(member_risks, noise_multiplier, clip_norm)
        p = np.array([float(sizes[c]) for c in cohort] + list(weighted.weights)) / total
        member_sd = {int(g): float(x) for g, x in zip(weighted.groups, s[len(cohort):])}
        out[r] = ReleasePlan(float(np.sqrt(np.sum(p ** 2 * s ** 2))), share, member_sd)
    return out


def setting_verdict(setting: str, canaries: CanarySet, weighted: WeightedCanaries, observer: ReleaseObserver,
                    rounds: dict[int, dict], plans: dict[int, ReleasePlan], delta: float, alpha: float,
                    rng: np.random.Generator) -> dict:
    """The verdict of one DP setting: per client group (and 'all') the tests behind it (see the module doc)."""
    released = [r for r in sorted(plans) if r in rounds and 1 <= r <= observer.rounds]
    if not released:
        return {"verdict": "underpowered", "reason": "no release to audit", "alpha": alpha, "groups": {}}
    if any(not plans[r].sd > 0 for r in released):  # n_eps = 0 (warned by the ServerApp): nothing to test against
        return {"verdict": "underpowered", "reason": "no noise configured: the formal epsilon is infinite",
                "alpha": alpha, "groups": {}}
    clip = canaries.clip_norm
    proj_all = np.stack(observer.projections)[[r - 1 for r in released]]  # evaluate_fn sees rounds 1..T in order
    sd = np.array([plans[r].sd for r in released])
    key = "sigma" if setting == "gdp" else "sigma_release"
    reported = [float(rounds[r].get(key, math.nan)) for r in released]
    groups = sorted({int(g) for g in canaries.groups})
    # r_{k,t}: each canary's formal signal-to-noise per release; the scores (module doc)
    snr = np.array([[plans[r].share[int(g)] * clip / plans[r].sd for g in canaries.groups] for r in released])
    scores = np.sum(snr * proj_all / sd[:, None], axis=0) / np.sqrt(np.sum(snr ** 2, axis=0))
    mu = {g: float(np.sqrt(sum((plans[r].share[g] * clip / plans[r].sd) ** 2 for r in released))) for g in groups}
    alpha_group = alpha / (len(groups) + 1)
    out: dict[str, dict] = {}

    mu_of = np.array([mu[int(g)] for g in canaries.groups])
    # the release's signal energy along a random direction is one property of the release: estimated once,
    # from every held-out direction (a group's 2 x 20 projections alone would make its power a coin toss)
    ratio_all = float(np.sqrt(np.mean((proj_all[:, ~canaries.inserted] / sd[:, None]) ** 2)))
    energy = max(0.0, ratio_all ** 2 - 1.0)

    def group(name: str, mask: np.ndarray, mu_formal: float, extra: list[dict], n_stat: int) -> None:
        a = alpha_group / n_stat
        s_in, s_out = scores[mask & canaries.inserted], scores[mask & ~canaries.inserted]
        eps_formal = gdp_epsilon(mu_formal, delta)
        tests = [honest_noise_power(noise_test(proj_all[:, mask & ~canaries.inserted], sd, a), energy),
                 honest_separation_power(separation_test(s_in, s_out, mu_formal, a)),
                 bound_test(s_in, s_out, eps_formal, delta, a, rng),
                 signal_test(s_in, s_out, float(mu_of[mask & canaries.inserted].mean()),
                             float((mu_of * canaries.norms / clip)[mask & canaries.inserted].mean()), a), *extra]
        v = decide(tests)
        v["alpha"] = alpha_group
        if v["verdict"] == "consistent":
            unpowered = [c for c, names in CLASSES.items() if not set(names) & set(v["powered"])]
            if unpowered:
                v.update(verdict="underpowered", unpowered=unpowered)
        v.update(mu_formal=mu_formal, eps_formal=eps_formal, ceiling=tests[2]["ceiling"])
        out[name] = v

    everyone = np.ones(canaries.groups.size, dtype=bool)
    # typed in privacy/audit/verdict.py: reported_sigma_test reads any array-like (np.asarray)
    pooled = [reported_sigma_test(reported, cast("Sequence[float]", sd))]
    if setting == "pdp":  # every client's noised canaries, each against its own configured sigma_g
        rows = [(r, g, p) for g in groups for r, p in weighted.noised_projections.get(g, []) if r in plans]
        if rows:
            t = honest_noise_power(noise_test(np.stack([p for _, _, p in rows]),
                                              [plans[r].member_sd[g] for r, g, _ in rows], alpha_group / 5), 0.0)
            pooled.append({**t, "test": "member-noise"})
    group("all", everyone, max(mu.values()), pooled, 5 if setting == "pdp" else 4)
    for g in groups:
        extra = []
        if setting == "pdp":
            mine = [r for r in released if g in rounds[r].get("sigmas", {})]
            if mine:
                extra.append(reported_sigma_test([rounds[r]["sigmas"][g] for r in mine],
                                                 [plans[r].member_sd[g] for r in mine]))
            own_rows = [(r, p) for r, p in weighted.noised_projections.get(g, []) if r in plans]
            if own_rows:
                t = honest_noise_power(noise_test(np.stack([p for _, p in own_rows]),
                                                  [plans[r].member_sd[g] for r, _ in own_rows], alpha_group / 5), 0.0)
                t["test"] = "member-noise"
                extra.append(t)
        group(str(g), canaries.groups == g, mu[g], extra, 5 if setting == "pdp" else 4)
    return {"verdict": worst([v["verdict"] for v in out.values()]), "alpha": alpha, "groups": out}


def honest_noise_power(test: dict, e: float) -> dict:
    """The noise test's power against half the noise, given the signal energy ``e`` the measurement shows.

    Under the configured noise the statistic per coordinate is 1 + e (e: the release's signal energy
    along a random direction, over sigma^2; estimated as max(0, r^2 - 1) from the ratio r measured on
    every held-out direction; 0 for the member-noise components, which are orthogonal to the member's
    update); with half the noise it would be 1/4 + e: power P(chi^2_n (1/4 + e) / n < q_alpha / n).
    """
    n = int(test["n"])
    q = float(stats.chi2.ppf(test["alpha"], n))
    power = float(stats.chi2.cdf(q / (0.25 + e), n))
    return {**test, "powered": power >= POWER, "signal_energy_over_noise": e, "power_at_half_noise": power}


def honest_separation_power(test: dict) -> dict:
    """The separation test's power against twice the formal mu, at the statistic's measured efficiency."""
    if "reference_mu" not in test or test["mu_formal"] <= 0:
        return test
    eff = min(1.0, max(0.0, test["mu_hat"] / test["mu_formal"]))
    n1, n0 = test["n_in"], test["n_out"]
    df, scale = n1 + n0 - 2, math.sqrt(1 / n1 + 1 / n0)
    crit = float(stats.nct.ppf(1 - test["alpha"], df, test["mu_formal"] / scale))
    power = float(stats.nct.sf(crit, df, eff * test["reference_mu"] / scale)) if eff > 0 else 0.0
    return {**test, "powered": power >= POWER, "efficiency": eff, "power_at_reference": power}


def signal_test(scores_in: np.ndarray, scores_out: np.ndarray, mu_expected: float, mu_unclipped: float,
                alpha: float) -> dict:
    """Is the inserted canaries' mean signal (configured-SD units) above their clipped contribution? (Welch t)

    ``mu_expected``: their mean formal signal (clipped to C); ``mu_unclipped``: what it would be if they
    entered at their own norms (the reference bug, against which the power is computed).
    """
    s_in, s_out = np.asarray(scores_in, dtype=np.float64), np.asarray(scores_out, dtype=np.float64)
    n1, n0 = s_in.size, s_out.size
    v1, v0 = s_in.var(ddof=1) / n1, s_out.var(ddof=1) / n0
    se = math.sqrt(v1 + v0)
    diff = float(s_in.mean() - s_out.mean())
    if se == 0:
        return {"test": "canary-signal", "fired": diff > mu_expected, "powered": True, "alpha": alpha,
                "p_value": 0.0 if diff > mu_expected else 1.0, "signal": diff, "signal_formal": mu_expected}
    df = (v1 + v0) ** 2 / (v1 ** 2 / (n1 - 1) + v0 ** 2 / (n0 - 1))  # Welch-Satterthwaite
    t = (diff - mu_expected) / se
    p_value = float(stats.t.sf(t, df))
    crit = float(stats.t.ppf(1 - alpha, df))
    power = float(stats.t.sf(crit - (mu_unclipped - mu_expected) / se, df))  # the canaries enter unclipped
    return {"test": "canary-signal", "fired": p_value < alpha, "powered": power >= POWER, "alpha": alpha,
            "p_value": p_value, "signal": diff, "signal_formal": mu_expected, "signal_over_formal":
            diff / mu_expected if mu_expected > 0 else math.inf, "signal_unclipped": mu_unclipped, "power_unclipped": power}
