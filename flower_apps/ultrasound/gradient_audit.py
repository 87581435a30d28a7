"""White-box gradient-canary audit of client 0's DP-SGD, with a verdict (issue 37).

``us-audit-canary='gradient'``: the audited client's DP optimizer carries m Dirac gradient canaries of
norm C (:mod:`privacy.dpsgd.canaries`), half of them (the auditor's coin flips) inserted into the
clipped sum of a step with the loader's Poisson rate q, before the optimizer's own noise; every step's
privatized sum is read along each canary. The client sends those readings in its audit record (taken out
of the reply by :class:`flower_apps.ultrasound.audit.AuditTap` before the strategy sees it); the server
computes the verdict (:func:`privacy.audit.example_level.gradient_canary_verdict`) with references from
the *configured* z and C alone: a DP optimizer whose noise multiplier is smaller than the ledger's
(``dp-fault=dpsgd-noise-div-2/-10``) is a ``violation``.

Threat model: all iterates, white box (Nasr et al. 2023): the adversary sees every noised gradient sum of
client 0's DP-SGD, which is exactly what the accountant's epsilon covers; it never sees the client's
examples or the noise. Canary coordinates and sampling are the auditor's own draws (from the run seed on
a stream nothing else uses); the noise is the client's secret source, untouched.

:func:`flower_apps.ultrasound.audit_trial.audit_trial` is one audited client training (client 0 alone,
round after round, through the real ClientApp handler and optimizer) for ``benchmarks/audit_detection.py``.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.app import ConfigRecord

from privacy.audit.example_level import gradient_canary_verdict
from privacy.dpsgd import DpSgdEvent, GradientCanaries, rdp_epsilon
from registry import streams

DEFAULT_GRADIENT_CANARIES = 256  # Dirac coordinates are free: 128 held out measure the noise 128 times per step
RECORD_KEYS = frozenset({"projections", "sampled", "steps-observed", "canaries", "sample-rate", "accountant-steps"})


def gradient_canaries(req, server_round: int, clip_norm: float) -> GradientCanaries:
    """The audited client's canaries of one round: the server's coin flips, fixed coordinates, the round's sampling."""
    return GradientCanaries(req.included(), clip_norm, streams.rng("ultrasound.audit-coords", req.seed),
                            streams.rng("ultrasound.audit-steps", req.seed, int(server_round)))


def gradient_record(gc: GradientCanaries, accountant_steps: int) -> ConfigRecord:
    """The client's audit record: per step the privatized sum along each canary, and which canaries were sampled."""
    proj = np.asarray(gc.projections, dtype=np.float64).reshape(-1)
    sampled = np.asarray(gc.sampled, dtype=bool).reshape(-1)
    return ConfigRecord({"projections": [float(v) for v in proj], "sampled": [int(v) for v in sampled],
                         "steps-observed": gc.steps, "canaries": gc.m, "sample-rate": float(gc.sample_rate or 0.0),
                         "accountant-steps": int(accountant_steps)})


def parse_gradient_record(rec, m: int) -> dict:
    """A reply's audit record, validated (keys, types, sizes, finiteness) before any arithmetic touches it."""
    keys = set(rec.keys())
    if keys != RECORD_KEYS:
        raise ValueError(f"gradient audit record: keys {sorted(keys)}, expected {sorted(RECORD_KEYS)}")
    steps, acc_steps, q = rec["steps-observed"], rec["accountant-steps"], rec["sample-rate"]
    if not (isinstance(steps, int) and isinstance(acc_steps, int) and 0 <= steps <= acc_steps):
        raise ValueError(f"gradient audit record: need 0 <= steps-observed <= accountant-steps, got {steps}, "
                         f"{acc_steps}")
    if rec["canaries"] != m:
        raise ValueError(f"gradient audit record: {rec['canaries']} canaries, the audit has {m}")
    if not (isinstance(q, float) and 0 < q <= 1):
        raise ValueError(f"gradient audit record: sample-rate must be in (0, 1], got {q!r}")
    proj = np.asarray(rec["projections"], dtype=np.float64)
    sampled = np.asarray(rec["sampled"])
    if proj.shape != (steps * m,) or sampled.shape != (steps * m,):
        raise ValueError(f"gradient audit record: {steps} steps x {m} canaries need {steps * m} projections and "
                         f"sampling bits, got {proj.shape} and {sampled.shape}")
    if not np.all(np.isfinite(proj)) or not np.all(np.isin(sampled, (0, 1))):
        raise ValueError("gradient audit record: projections must be finite and sampling bits 0 or 1")
    return {"projections": proj.reshape(steps, m), "sampled": sampled.astype(bool).reshape(steps, m),
            "sample_rate": q, "accountant_steps": acc_steps}


def run_gradient_audit(req, records: list[dict], cfg) -> dict:
    """audit.json's content for a gradient audit: the verdict, its tests and the observations' summaries."""
    if not records:
        raise RuntimeError("the audited client sent no gradient audit record: was it in the cohort?")
    proj = np.concatenate([r["projections"] for r in records])
    sampled = np.concatenate([r["sampled"] for r in records])
    if proj.shape[0] == 0:
        raise RuntimeError("the audited client took no DP-SGD step: nothing to audit")
    # the accountant on the configured z (never the optimizer's), the loader's q and every step it counted
    eps_formal = rdp_epsilon([DpSgdEvent(cfg.noise_multiplier, r["sample_rate"], r["accountant_steps"])
                              for r in records], cfg.delta)
    included = req.included()
    res = gradient_canary_verdict(proj, sampled, included, noise_multiplier=cfg.noise_multiplier,
                                  clip_norm=cfg.max_grad_norm, eps_formal=eps_formal, delta=cfg.delta)
    one_run = res.pop("one_run")
    return {"method": "white-box gradient canaries, all iterates (Nasr et al. 2023; one run: Steinke, Nasr, "
                      "Jagielski 2023)",
            "canary_kind": req.kind, "canaries": req.canaries, "included": int(included.sum()),
            "audited_client": req.client, "rounds_scored": len(records), "steps_observed": int(proj.shape[0]),
            "delta": cfg.delta, "noise_multiplier_configured": cfg.noise_multiplier,
            "max_grad_norm_configured": cfg.max_grad_norm, "dp_fault": cfg.dp_fault or None,
            "eps_formal_rdp": eps_formal, **res,
            "threat_models": {"all-iterates": {**one_run, "scores": res["scores_all_steps"]}},
            "included_bits": [int(b) for b in included]}


def verdict_cells(a: dict) -> dict:
    """Table cells of a gradient audit: verdict, measured / configured noise, separation, bound with its ceiling."""
    tests = {t["test"]: t for t in a["tests"]}
    sep, bound = tests.get("separation", {}), tests.get("lower-bound", {})
    fmt = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"
    return {"verdict": a["verdict"] + (f" ({', '.join(a['fired'])})" if a["fired"] else ""),
            "noise measured / configured": fmt(a.get("measured_over_configured")),
            "separation mu_hat / formal mu": f"{fmt(sep.get('mu_hat'))} / {fmt(sep.get('mu_formal'))}",
            "lower bound / ceiling / eps formal": f"{fmt(bound.get('eps_lower'))} / {fmt(bound.get('ceiling'))} / "
                                                  f"{fmt(bound.get('eps_formal'))}"}
