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
  different mu_g has separation <= max mu_g);
* each client g (its own canaries): ``measured-noise`` (its held-out directions), ``separation`` vs
  mu_g, ``lower-bound`` vs eps_g; under PDP also ``reported-sigma`` (sigma_g reported vs configured)
  and ``member-noise``: the noised updates of the canaries standing for g, as the trusted server
  holds them, along g's held-out directions, against the configured sigma_g. PDP's personalization
  only shows there: one client's sigma_g / 10 moves the release's SD by a few percent.

Family-wise error: ALPHA over the whole run (Bonferroni): ALPHA / settings per setting, split equally
over its groups, then over each group's statistical tests (the reported-sigma test is exact). The
setting's verdict is the worst of its groups' and the run's the worst of its settings' (violation >
underpowered > consistent): a run is consistent only when every audited setting is shown to be.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from privacy.audit import CanarySet, ReleaseObserver, gdp_epsilon
from privacy.audit.verdict import ALPHA, bound_test, decide, noise_test, reported_sigma_test, separation_test
from privacy.personalized import gdp_sigma, personalized_sigmas
from strategies.canaries import WeightedCanaries

SEVERITY = {"consistent": 0, "underpowered": 1, "violation": 2}


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
    scores = observer.scores()["all-iterates"]
    groups = sorted({int(g) for g in canaries.groups})
    mu = {g: float(np.sqrt(sum((plans[r].share[g] * clip / plans[r].sd) ** 2 for r in released))) for g in groups}
    alpha_group = alpha / (len(groups) + 1)
    out: dict[str, dict] = {}

    def group(name: str, mask: np.ndarray, mu_formal: float, extra: list[dict], n_stat: int) -> None:
        a = alpha_group / n_stat
        s_in, s_out = scores[mask & canaries.inserted], scores[mask & ~canaries.inserted]
        eps_formal = gdp_epsilon(mu_formal, delta)
        tests = [noise_test(proj_all[:, mask & ~canaries.inserted], sd, a),
                 separation_test(s_in, s_out, mu_formal, a),
                 bound_test(s_in, s_out, eps_formal, delta, a, rng), *extra]
        v = decide(tests)
        v["alpha"] = alpha_group
        v.update(mu_formal=mu_formal, eps_formal=eps_formal, ceiling=tests[2]["ceiling"])
        out[name] = v

    everyone = np.ones(canaries.groups.size, dtype=bool)
    group("all", everyone, max(mu.values()), [reported_sigma_test(reported, sd)], 3)
    for g in groups:
        extra = []
        if setting == "pdp":
            mine = [r for r in released if g in rounds[r].get("sigmas", {})]
            if mine:
                extra.append(reported_sigma_test([rounds[r]["sigmas"][g] for r in mine],
                                                 [plans[r].member_sd[g] for r in mine]))
            rows = [(r, p) for r, p in weighted.noised_projections.get(g, []) if r in plans]
            if rows:
                t = noise_test(np.stack([p for _, p in rows]), [plans[r].member_sd[g] for r, _ in rows],
                               alpha_group / 4)
                t["test"] = "member-noise"
                extra.append(t)
        group(str(g), canaries.groups == g, mu[g], extra, 4 if setting == "pdp" else 3)
    return {"verdict": worst([v["verdict"] for v in out.values()]), "alpha": alpha, "groups": out}
