"""dfl-dp's empirical privacy audit: the run's audit.json, and the formal-vs-audited table of the sweep.

A run with ``audit-canaries = K`` inserts K/2 canary clients (strategies.canaries) into every round
of FL (Algorithm 1) or, as extra hops, of the sequential chain (Algorithm 2), and scores all K on the
released models (privacy.audit.client_level). Formal epsilons beside the audited ones:

* ``eps_formal_add_remove``: what the mechanism claims for one canary under add/remove adjacency,
  from its own per-round ledger (sigma_abs and cohort m of each round): per round the canary's
  contribution C/m (FL mean) or C (chain: the round update is projected onto the C-ball, which is
  1-Lipschitz, and the canary is the last hop) under noise sigma_abs; T rounds compose to mu-GDP.
  This is the number the audit is commensurate with: an audited value above it is a bug.
* ``eps_formal_study``: the study's own accounting (replace-one, 2C/N or 2C; privacy.accounting,
  exact GDP), for the reader's orientation.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from flower_apps.common.results import atomic_write_json, read_json
from flower_apps.common.tables import write_table
from privacy.audit import CanarySet, ReleaseObserver, estimate, formal_add_remove_epsilon
from privacy.audit.stats import format_eps

CONFIDENCE = 0.95


def audit_result(framework: str, clip_norm: float, delta: float, canaries: CanarySet, observer: ReleaseObserver,
                 rounds: dict[int, dict], rng: np.random.Generator, eps_formal_study: float | None) -> dict:
    """The run's audit: both threat models, and the formal epsilons to compare with.

    ``rounds``: per round the metrics of the released model (``sigma-abs``, ``num-contributors``,
    ``num-canaries``); a round without a release contributes nothing.
    """
    ratios = []
    for r in sorted(rounds):
        m = rounds[r]
        if "sigma-abs" not in m:
            continue
        cohort = int(m["num-contributors"]) + int(m.get("num-canaries", 0))
        signal = clip_norm / cohort if framework == "fl" else clip_norm
        ratios.append(math.inf if m["sigma-abs"] == 0 else signal / float(m["sigma-abs"]))
    formal = math.inf if any(math.isinf(x) for x in ratios) else formal_add_remove_epsilon(ratios, delta)
    est = estimate(canaries, observer.scores(), delta, CONFIDENCE, rng)
    return {"framework": framework, "delta": delta, "confidence": CONFIDENCE, "canaries": canaries.describe(),
            "released_rounds": observer.rounds, "eps_formal_add_remove": formal, "eps_formal_study": eps_formal_study,
            "threat_models": {tm: v["-1"] for tm, v in est.items()}}


def write_audit(out: Path, result: dict) -> None:
    """``audit.json`` in the run folder (atomic)."""
    atomic_write_json(out / "audit.json", result)


def audit_rows(results_dir: str | Path) -> list[dict]:
    """One row per audited run (finished runs with an audit.json)."""
    rows = []
    for p in sorted((Path(results_dir) / "dfl-dp" / "runs").glob("*/audit.json")):
        if not (p.parent / "summary.json").is_file():
            continue
        s, a = read_json(p.parent / "summary.json"), read_json(p)
        ai, fm = a["threat_models"]["all-iterates"], a["threat_models"]["final-model"]
        rows.append({"run": s["run"], "framework": a["framework"], "C": s["clip_norm"], "eps_cal": s["eps_cal"],
                     "N": s["num_clients"], "T": s["num_rounds"], "seed": s["seed"],
                     "canaries (in/total)": f"{a['canaries']['num_inserted']}/{a['canaries']['num_canaries']}",
                     "eps formal (study, replace-one)": format_eps(a["eps_formal_study"], "> 500"),
                     "eps formal (add/remove)": format_eps(a["eps_formal_add_remove"]),
                     "all-iterates: lower bound (95%)": format_eps(ai["eps_lower"]),
                     "all-iterates: point estimate": format_eps(ai["eps_point"]),
                     "final model: lower bound (95%)": format_eps(fm["eps_lower"]),
                     "final model: point estimate": format_eps(fm["eps_point"]),
                     "final acc": f"{s['final_acc']:.4f}"})
    return rows


def write_audit_table(results_dir: str | Path) -> str:
    """``audit_formal_vs_empirical.{csv,md}`` under ``<results>/dfl-dp``; '' when no run was audited."""
    rows = audit_rows(results_dir)
    if not rows:
        return ""
    return write_table(rows, Path(results_dir) / "dfl-dp" / "audit_formal_vs_empirical",
                       "Empirical privacy audit: formal vs audited client-level epsilon",
                       "delta = delta-total. Lower bound: Clopper-Pearson at 95% confidence (half split); point "
                       "estimate: Andrew et al. (2024) Gaussian fit, no guarantee. An audited value above the "
                       "add/remove formal epsilon is a bug. See docs/audit.md.")
