"""tabular-pdp ServerApp logic: one run (seed, poison) -> one results folder.

Order (paper, Sections IV-VI): (A) anonymize per client and harmonize levels; (B) one local
training round from w(0) -> pairwise divergence, Figure 1 heatmap, flagged clients excluded;
(C) clip-norm estimate: aggregate (B) without DP, train again, 90th percentile of the update
norms; (D) for each setting (vanilla FedAvg, GDP, PDP) num-rounds rounds from the same w(0)
through Flower's round loop; test MAE / MRE on the clients' test splits each round;
per-client (eps, delta) for GDP and PDP.

Folder: config.json, anonymization.{json,csv,md}, drift.json, drift_heatmap.png, rounds.jsonl,
table3.{csv,md}, summary.json.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from datasets.base import DataError
from datasets.cancer import describe_source
from flower_apps.common.node_data import RoundErrors, discover
from flower_apps.common.results import (
    atomic_write_json,
    atomic_write_jsonl,
    close_run_folder,
    discard_unstarted,
    open_run_folder,
    run_finished,
    run_folder,
    run_hash,
)
from flower_apps.common.torch_utils import record_to_state, save_state_dict, state_to_record
from flower_apps.config import noise_condition
from flower_apps.tabular_pdp.config import ACTION, TabularPdpConfig
from flower_apps.tabular_pdp.data import model_features
from flower_apps.tabular_pdp.model import build_model
from flower_apps.tabular_pdp.phases import anonymize_and_harmonize, exchange, message_config
from flower_apps.tabular_pdp.report import write_anonymization, write_drift, write_run_table
from flower_apps.tabular_pdp.strategy import CohortFedAvg
from privacy.audit.verdict import ALPHA
from privacy.clip_estimate import check_clip_norm, robust_quantile
from privacy.drift import detect_drift, flatten
from privacy.mechanisms import global_l2_norm
from privacy.personalized import aggregate_sigma, gdp_sigma
from privacy.randomness import STREAM_TABULAR_SERVER, NoiseSource
from privacy.tabular_accounting import client_budgets
from strategies.base import FastGrid
from strategies.clipping_wrapper import ClippingWrapper
from strategies.cohorts import round_problems, wait_for_nodes
from strategies.drift_guard import DriftGuard
from strategies.layer import set_reply_rules
from strategies.personalized_clipping import PersonalizedServerSideClipping
from strategies.records import array_record, from_numpy, number, to_numpy
from strategies.reply_rules import ReplyRules
from strategies.server_fixed_clipping import ServerSideFixedClipping

log = logging.getLogger("flwr")
SETTING_CODE = {"vanilla": 0, "gdp": 1, "pdp": 2}
NO_CLIENT = -1  # the audit canaries' pooled weight in the per-client ledger (never a client id)


def model_path(run_folder: Path, setting: str) -> Path:
    """Where the final global model of ``setting`` is stored (a CPU state dict; read by attacks.py)."""
    return Path(run_folder) / f"final_model_{setting}.pt"


def run_dir(cfg: TabularPdpConfig) -> Path:
    """Where a run writes its results."""
    return run_folder("tabular-pdp", cfg)


def is_complete(cfg: TabularPdpConfig) -> bool:
    """True when this exact config already has a summary (sweeps resume)."""
    return run_finished(run_dir(cfg), cfg)


def weighted_mean(models: dict[int, OrderedDict], weights: Mapping[int, float]) -> OrderedDict:
    """FedAvg of client models (weights = train sizes), accumulated in float64."""
    total = float(sum(weights[c] for c in models))
    first = next(iter(models.values()))
    out = OrderedDict()
    for k in first:
        acc = sum(models[c][k].astype(np.float64) * (weights[c] / total) for c in models)
        out[k] = acc.astype(first[k].dtype)
    return out


FIT_METRICS = frozenset({"num-examples", "train-loss"})  # what a fit reply's metrics hold (client_app._fit)


def fit_rules(records: dict[int, int] | None = None, committed: dict[int, int] | None = None) -> ReplyRules:
    """What a fit reply must satisfy (strategies.reply_rules): the model sent, back finite; its metrics and no
    others; ``num-examples`` at most the client's harmonized record count, or exactly the size it committed
    in round 1 (the sizes the FedAvg weights and the privacy ledger use)."""
    return ReplyRules(metric_keys=FIT_METRICS, max_examples_of=records, committed_examples=committed)


def local_fit(grid: Grid, cfg: TabularPdpConfig, clients: list[int], arrays: ArrayRecord, levels, server_round: int,
              records: dict[int, int] | None = None, placement: dict[int, int] | None = None,
              ) -> tuple[dict[int, OrderedDict], dict[int, int], dict[int, str | None]]:
    """One local training round outside the strategy loop: (models, train sizes, failures)."""
    replies = exchange(grid, clients, arrays, message_config(cfg, levels, server_round), cfg.round_timeout,
                       fit_rules(records), placement=placement)
    models, sizes, failed = {}, {}, {}
    for cid, r in replies.items():
        if r is None or r.has_error():
            failed[cid] = "no reply" if r is None else r.error.reason
            continue
        models[cid] = to_numpy(array_record(r.content["arrays"]))
        sizes[cid] = int(number(r.content["metrics"]["num-examples"]))
    return models, sizes, failed


def _strategy(setting: str, cfg: TabularPdpConfig, clients: list[int], clip_norm: float, risks: dict[int, float],
              canaries=None, placement: dict[int, int] | None = None):
    base = CohortFedAvg(clients, ACTION, placement)
    # Secret noise (OS entropy) unless the server's local noise-seed-file is given: never from the run seed;
    # seeded, mixed with the run's config hash (no two grid points share noise).
    noise = NoiseSource(cfg.noise_seed_file, noise_condition(cfg))
    rng = noise.numpy_generator(STREAM_TABULAR_SERVER, cfg.seed, SETTING_CODE[setting])
    seeded = noise.mode == "seeded"  # only a seeded generator's state may go into a round checkpoint (strategies.resume)
    strat: Strategy
    if setting == "vanilla":
        strat = base
    elif setting == "gdp":
        strat = ServerSideFixedClipping(base, cfg.noise_multiplier, clip_norm, rng, canaries, fault=cfg.dp_fault,
                                        keep_noise_state=seeded)
    else:  # a dp-fault (tests only, privacy/faults.py) breaks the mechanism itself, in both settings
        strat = PersonalizedServerSideClipping(base, cfg.noise_multiplier, clip_norm, risks, rng, canaries,
                                               fault=cfg.dp_fault, keep_noise_state=seeded)
    if cfg.drift_recheck > 0:
        return DriftGuard(strat, base, cfg.drift_recheck, cfg.drift_threshold, cfg.drift_min_ratio), strat, base
    return strat, strat, base


def run_setting(grid: Grid, cfg: TabularPdpConfig, setting: str, clients: list[int], w0: ArrayRecord, levels,
                clip_norm: float, risks: dict[int, float], sizes: dict[int, int],
                errors: RoundErrors | None = None, placement: dict[int, int] | None = None) -> tuple[dict, list[dict]]:
    """num-rounds rounds of one setting through Flower's Strategy.start; (summary, per-round rows).

    Every planned client that did not contribute to a round (error reply, timeout, rejected reply) is
    added to ``errors`` with its node and reason (the run summary's ``round_errors``). ``placement``
    (node-local data): the node holding each client, where its messages go.
    """
    audit = None
    if cfg.audit_canaries and setting != "vanilla":  # canary clients per client (docs/audit.md)
        from flower_apps.tabular_pdp.audit_report import SettingAudit

        audit = SettingAudit(cfg.audit_canaries, cfg.seed, cfg.noise_seed_file, setting, clients, w0, clip_norm,
                             sizes, risks, cfg.delta, condition=noise_condition(cfg),
                             noise_multiplier=cfg.noise_multiplier)
    outer, dp, base = _strategy(setting, cfg, clients, clip_norm, risks, audit.weighted if audit else None, placement)
    set_reply_rules(outer, fit_rules(committed=sizes))  # every layer checks replies against the same rules
    t0 = time.perf_counter()
    result = outer.start(FastGrid(grid), w0, num_rounds=cfg.num_rounds, timeout=cfg.round_timeout,
                         train_config=message_config(cfg, levels), evaluate_config=message_config(cfg, levels),
                         evaluate_fn=audit.observe if audit else None)  # the auditor sees the released models
    # The released global model, for the attacks (flower_apps/tabular_pdp/attacks.py) and the report card.
    save_state_dict(record_to_state(result.arrays), model_path(run_dir(cfg), setting))
    if errors is not None:
        for r, probs in sorted(round_problems(outer).items()):
            errors.record_problems(r, {c: f"{setting}: {why}" for c, why in probs.items()}, placement or {})
    rows = []
    for r in range(1, cfg.num_rounds + 1):
        ev = result.evaluate_metrics_clientapp.get(r, {})
        tr = result.train_metrics_clientapp.get(r, {})
        row = {"setting": setting, "round": r, "test_mae": ev.get("test-mae"), "test_mre": ev.get("test-mre"),
               "test_rmse": ev.get("test-rmse"), "train_loss": tr.get("train-loss"),
               "contributors": base.contributors.get(r, [])}
        info = dp.rounds.get(r) if isinstance(dp, ClippingWrapper) else None
        if info:
            row.update({"clipped": info.get("clipped"), "m": info.get("m"), "sigma": info.get("sigma"),
                        "sigmas": info.get("sigmas"), "max_update_norm": max(info["update_norms"].values(), default=0)})
        rows.append(row)
    last = rows[-1]
    summary = {"setting": setting, "final_mae": last["test_mae"], "final_mre": last["test_mre"],
               "final_rmse": last["test_rmse"], "per_client": {str(c): v for c, v in base.per_client_eval.items()},
               "clients": base.client_ids, "seconds": time.perf_counter() - t0}
    if audit is not None:
        # the run's family-wise alpha, split over its audited settings (flower_apps/tabular_pdp/audit_verdict.py)
        audited = [s for s in cfg.settings if s != "vanilla"]
        summary["audit"] = audit.result(dp.rounds, base.contributors, ALPHA / len(audited))
    if setting != "vanilla":
        summary.update(_accounting(setting, cfg, dp, base, clip_norm, sizes))
    if isinstance(outer, DriftGuard):
        summary["drift_rechecks"] = {str(r): rep.to_json() for r, rep in outer.reports.items()}
    return summary, rows


def _accounting(setting: str, cfg: TabularPdpConfig, dp: ClippingWrapper, base: CohortFedAvg, clip_norm: float,
                sizes: dict[int, int]) -> dict:
    contributed = sorted({c for cs in base.contributors.values() for c in cs})
    rounds = {c: sum(c in cs for cs in base.contributors.values()) for c in contributed}
    weights: dict[int, float] = {c: sizes[c] for c in contributed}
    if not contributed:
        return {"accounting": {}}
    # Audit canaries (docs/audit.md) share the FedAvg mean: their weight (pseudo-client -1, dropped
    # from the result) keeps each real client's share p_i = n_i / (W + W_canaries) right.
    canaries = dp.canaries
    if canaries is not None:
        weights[NO_CLIENT] = float(canaries.weights.sum())
    if setting == "gdp":
        sig = min(info["sigma"] for info in dp.rounds.values() if "sigma" in info)
        budgets = client_budgets(weights, clip_norm, sig, rounds, cfg.delta)
        ratio = 1.0
    else:
        per_round = []
        server_view: dict[int, float] = {}
        for info in dp.rounds.values():
            ids = list(info["sigmas"])
            per_round.append(info["sigma_release"] if "sigma_release" in info else  # with canaries: all members
                             aggregate_sigma([info["sigmas"][c] for c in ids], [sizes[c] for c in ids]))
            for c in ids:
                server_view[c] = min(server_view.get(c, np.inf), info["sigmas"][c])
        if canaries is not None:
            server_view[NO_CLIENT] = 1.0  # the canaries' row is dropped below
        sig = min(per_round)
        budgets = client_budgets(weights, clip_norm, sig, rounds, cfg.delta, server_view)
        cohort = len(contributed) + (canaries.num_inserted if canaries is not None else 0)
        ratio = sig / gdp_sigma(cfg.noise_multiplier, clip_norm, cohort)
    budgets.pop(NO_CLIENT, None)
    eps = [b["eps_rdp"] for b in budgets.values()]
    return {"sigma_release": sig, "sigma_release_over_gdp": ratio,
            "eps_rdp_min": min(eps), "eps_rdp_max": max(eps), "delta": cfg.delta,
            "accounting": {str(c): b for c, b in budgets.items()}}


def server_main(grid: Grid, cfg: TabularPdpConfig) -> dict:
    """Run one configuration through Flower and write its results folder. Returns the summary."""
    from flower_apps.tabular_pdp.data import validate_data

    if not cfg.node_local_data:  # with node-local data the coordinator holds no table (node_data.py)
        validate_data(cfg)  # unusable data fails here, in seconds: no run folder, no message sent
    out = open_run_folder(run_dir(cfg), cfg)
    t_start = time.perf_counter()
    if cfg.noise_multiplier == 0 and {"gdp", "pdp"} & set(cfg.settings):
        warnings.warn("tab-noise-multiplier = 0: GDP and PDP add no noise (epsilon is infinite)", stacklevel=2)
    clients, deployment, errors, placement = list(range(cfg.num_clients)), {}, RoundErrors(), None
    if cfg.node_local_data:  # the nodes say which clients (regions) they hold; messages go to the holder
        try:
            found = discover(grid, ACTION, message_config(cfg), cfg.round_timeout, cfg.num_clients)
        except DataError:  # refused before the first round (no usable node, one client claimed twice)
            discard_unstarted(out)
            raise
        clients, placement = found.client_ids, found.placement
        deployment = found.summary(range(cfg.num_clients))
    else:  # a simulation's SuperNodes may register after the ServerApp starts (as the other studies do)
        wait_for_nodes(grid, 1)

    # (A) anonymization: two message rounds
    anon = anonymize_and_harmonize(grid, cfg, clients, placement)
    write_anonymization(anon, cfg, out)
    active = anon.active
    if len(active) < 2:
        raise RuntimeError(f"only {len(active)} client(s) left after anonymization; skipped: {anon.skipped}")
    levels = anon.levels
    in_features = len(model_features(cfg.features, levels))
    w0 = state_to_record(build_model(cfg.seed, in_features))
    log.info("tabular-pdp %s: levels %s, %d active clients, %d model inputs", out.name, list(levels), len(active),
             in_features)

    # (B) drift detection after a first local round from w(0)
    records = {c: int(anon.harmonized[c]["n_original"]) for c in active if "n_original" in anon.harmonized[c]}
    models, sizes, failed = local_fit(grid, cfg, active, w0, levels, server_round=1, records=records,
                                      placement=placement)
    errors.record_problems(1, {c: f"drift detection: {why}" for c, why in failed.items()}, placement or {})
    if len(models) < 2:
        raise RuntimeError(f"only {len(models)} client(s) returned a model in the first round; failures: {failed}")
    ids = sorted(models)
    report = detect_drift(ids, [flatten(models[c]) for c in ids], cfg.drift_threshold, cfg.drift_min_ratio)
    poisoned = cfg.poison_client if cfg.poison != "none" else None
    write_drift(report, anon.regions, poisoned, out)
    participants = [c for c in ids if not (cfg.drift_exclude and c in report.flagged)]
    if len(participants) < 2:
        raise RuntimeError(f"only {len(participants)} client(s) left after drift detection (flagged {report.flagged})")

    # (C) clip-norm estimate (paper, Sec. VI): FedAvg without DP, train again, quantile of ||w_i - w_bar||
    norms: dict[int, float] = {}
    failed2: dict[int, str | None] = {}  # None: an error reply without a reason (flwr Error.reason)
    clip_est: float | None = None
    if cfg.settings:  # detection-only runs (sweep's drift demonstration) stop after (B)
        w_bar = weighted_mean({c: models[c] for c in participants}, sizes)
        models2, _, failed2 = local_fit(grid, cfg, participants, from_numpy(w_bar), levels, server_round=2,
                                        records=records, placement=placement)
        errors.record_problems(2, {c: f"clip-norm estimate: {why}" for c, why in failed2.items()}, placement or {})
        norms = {c: global_l2_norm([m[k].astype(np.float64) - w_bar[k] for k in w_bar]) for c, m in models2.items()}
        # An order statistic no single reply controls (privacy.clip_estimate): one norm of 1e6 among nine
        # honest ones no longer sets C. Needs 3 replies; with fewer the estimate is refused, never guessed.
        if len(norms) >= 3:
            clip_est = robust_quantile(list(norms.values()), cfg.clip_quantile, tolerate=1)
        elif cfg.clip_mode == "estimate":
            raise RuntimeError(f"tab-clip-mode='estimate' needs update norms from at least 3 clients, got "
                               f"{len(norms)}; use tab-clip-mode='fixed' with tab-clip-norm")
    clip_norm = clip_est if cfg.clip_mode == "estimate" and clip_est is not None else cfg.clip_norm
    clip_norm = check_clip_norm(clip_norm, f"tab-clip-mode={cfg.clip_mode!r}")
    risks = {c: float(anon.harmonized[c]["arirec"]) for c in participants}

    # (D) the three settings
    all_rows: list[dict] = []
    settings: dict[str, dict] = {}
    for setting in cfg.settings:
        summ, rows = run_setting(grid, cfg, setting, participants, w0, levels, clip_norm, risks, sizes, errors,
                                 placement)
        settings[setting] = summ
        all_rows += rows
        atomic_write_jsonl(out / "rounds.jsonl", all_rows)
        log.info("[%s] %s: MAE %.4f, MRE %.4f", out.name, setting, summ["final_mae"], summ["final_mre"])

    summary = {
        "config_hash": run_hash(cfg), "run": out.name, "seed": cfg.seed, "preset": cfg.preset,
        "dataset": cfg.dataset, "data_notes": _data_notes(cfg), "levels": list(levels),
        "levels_source": anon.levels_source, "anonymization": {str(c): v for c, v in anon.harmonized.items()},
        "own_levels": {str(c): v for c, v in anon.own.items()}, "regions": {str(c): r for c, r in anon.regions.items()},
        "skipped": {str(c): v for c, v in anon.skipped.items()},
        "model_inputs": list(model_features(cfg.features, levels)),
        "poison": cfg.poison, "poisoned_client": poisoned, "drift": report.to_json(),
        "detection_failures": {str(c): v for c, v in {**failed, **failed2}.items()},
        "participants": participants, "train_sizes": {str(c): sizes[c] for c in participants},
        "clip_norm_estimate": clip_est, "clip_norm": clip_norm, "clip_mode": cfg.clip_mode,
        "clip_quantile": cfg.clip_quantile, "update_norms_estimation": {str(c): v for c, v in norms.items()},
        "noise_multiplier": cfg.noise_multiplier, "num_rounds": cfg.num_rounds, "local_epochs": cfg.local_epochs,
        "dp_fault": cfg.dp_fault,  # issue 37: a deliberately broken mechanism (tests only); '' = the mechanism
        "settings": settings, "wall_seconds": time.perf_counter() - t_start,
        **NoiseSource(cfg.noise_seed_file).describe(), **deployment, **errors.summary(),
    }
    if settings:
        write_run_table(summary, out)
    audits = {k: v["audit"] for k, v in settings.items() if "audit" in v}
    if audits:
        from flower_apps.tabular_pdp.audit_report import run_audit

        atomic_write_json(out / "audit.json", run_audit(audits, cfg.dp_fault))
    atomic_write_json(out / "summary.json", summary)
    close_run_folder(out)
    return summary


def _data_notes(cfg: TabularPdpConfig) -> list[str]:
    notes = [describe_source(cfg.dataset, cfg.data_dir)]
    if cfg.data_fraction < 1:
        notes.append(f"data-fraction {cfg.data_fraction:g} of each region's rows (fixed-seed subsample)")
    return notes
