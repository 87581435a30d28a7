"""dfl-dp ServerApp logic: one run (framework, condition, seed) -> one results folder.

Folder contents: config.json (resolved), rounds.jsonl (per round: test accuracy and loss,
train loss, clipping, sigma_abs, contributors), summary.json (curve metrics, clipping
frequency, accounting), class_counts.csv and class_counts.png (the paper's Figure 3).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path

from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp import Grid

from datasets.base import DataError
from flower_apps.common.local_training import evaluate
from flower_apps.common.node_data import RoundErrors, discover
from flower_apps.common.results import (
    atomic_write_json,
    atomic_write_jsonl,
    atomic_write_text,
    close_run_folder,
    discard_unstarted,
    open_run_folder,
    run_finished,
    run_folder,
    run_hash,
)
from flower_apps.common.torch_utils import pick_device, record_to_state, save_state_dict, state_to_record
from flower_apps.config import noise_condition
from flower_apps.dfl_dp.config import ACTION, DflDpConfig
from flower_apps.dfl_dp.data import EvalPlan, eval_plan
from flower_apps.dfl_dp.metrics import curve_summary
from flower_apps.dfl_dp.victims import GRAD_PREFIX, STATE_PREFIX, extract, save
from models.small_cnn import build_small_cnn
from privacy.accounting import account, account_sampled
from privacy.audit import ReleaseObserver, auditor_generator, flat_params, make_canaries
from privacy.randomness import NoiseSource
from privacy.sampling import STREAM_CLIENT_SAMPLING, CohortSampler
from strategies.cohorts import config_record, round_problems, wait_for_nodes
from strategies.layer import set_reply_rules
from strategies.matched_perturbation import MatchedPerturbation
from strategies.observer import RoundObserver
from strategies.records import to_numpy
from strategies.registry import build_strategy
from strategies.reply_rules import ReplyRules

log = logging.getLogger("flwr")


def run_dir(cfg: DflDpConfig) -> Path:
    """Where a run writes its results."""
    return run_folder("dfl-dp", cfg)


def is_complete(cfg: DflDpConfig) -> bool:
    """True when this exact config already has a summary (sweeps resume)."""
    return run_finished(run_dir(cfg), cfg)


def write_class_counts(plan, out: Path) -> None:
    """Per-client class counts (CSV) and a stacked-bar plot like the paper's Figure 3."""
    counts = plan.class_counts()
    header = "client," + ",".join(f"class_{k}" for k in range(counts.shape[1])) + ",total\n"
    rows = "".join(f"{i}," + ",".join(map(str, r)) + f",{r.sum()}\n" for i, r in enumerate(counts))
    atomic_write_text(out / "class_counts.csv", header + rows)
    from flower_apps.dfl_dp.report import plot_class_counts

    plot_class_counts(counts, out / "class_counts.png")


def server_main(grid: Grid, cfg: DflDpConfig) -> dict:
    """Run one configuration through Flower and write its results folder. Returns the summary."""
    from flower_apps.dfl_dp.data import validate_data

    # Unusable data fails here, in seconds: no run folder, no message sent. With node-local data the
    # coordinator holds only its test set (eval-data-path); the nodes say what they hold (node_data.py).
    plan = eval_plan(cfg) if cfg.node_local_data else validate_data(cfg)
    out = open_run_folder(run_dir(cfg), cfg)
    if not cfg.node_local_data:
        write_class_counts(plan, out)
    device = pick_device(cfg.device)
    c, h, _ = plan.image_shape
    model = build_small_cnn(cfg.seed, c, plan.num_classes, h)
    initial = state_to_record(model)
    model = model.to(device)

    min_nodes = 1
    nodes = wait_for_nodes(grid, min_nodes)
    client_ids, deployment, placement = list(range(cfg.num_clients)), {}, None
    if cfg.node_local_data:  # the nodes say which clients they hold; each message goes to the holder
        try:
            found = discover(grid, ACTION, config_record_for(cfg), cfg.round_timeout, cfg.num_clients)
        except DataError:  # refused before the first round (no usable node, one client claimed twice)
            discard_unstarted(out)
            raise
        client_ids, placement = found.client_ids, found.placement
        assert isinstance(plan, EvalPlan)  # typing: under node-local-data the plan is eval_plan(cfg) (above)
        for c, counts in found.label_counts().items():
            plan.counts[c] = counts
        write_class_counts(plan, out)
        deployment = found.summary(range(cfg.num_clients))
    canaries = auditor = audit_rng = None
    if cfg.audit_canaries:
        # The auditor's own randomness (OS entropy, or the local seed file on another stream than the noise).
        audit_rng = auditor_generator(cfg.noise_seed_file, cfg.seed, condition=noise_condition(cfg))
        w0 = flat_params(to_numpy(initial))
        # Norms C x U(2, 10): above the clip norm, so that they test the clip they pass through (issue 37).
        canaries = make_canaries(cfg.audit_canaries, w0.size, cfg.clip_norm, audit_rng, norm_range=CANARY_NORM_RANGE)
        auditor = ReleaseObserver(canaries, w0)  # sees the released models only
    noise = NoiseSource(cfg.noise_seed_file, noise_condition(cfg))
    sampler = cohort_sampler(cfg, noise, 0 if canaries is None else int(canaries.inserted.sum()))
    strategy = build_strategy(
        cfg.framework, client_ids, ACTION, cfg.clients_per_message, dp=cfg.dp,
        clip_norm=cfg.clip_norm, eps_cal=cfg.eps_cal, delta_cal=cfg.delta_cal,
        noise=noise, stream=(cfg.seed,), canaries=canaries,
        fault=cfg.dp_fault, placement=placement, sampler=sampler,
    )
    # Every reply is validated before it touches a model (strategies.reply_rules): a logical client
    # reports at most every training example once per local epoch; captured victim gradients are side arrays.
    set_reply_rules(strategy, ReplyRules(max_examples=max(1, _n_train(plan)) * cfg.local_epochs,
                                         metric_keys=TRAIN_METRIC_KEYS, side_arrays=(GRAD_PREFIX, STATE_PREFIX)))
    log.info("dfl-dp %s: %d logical clients on %d nodes, %d rounds, data %s (%d target-train)",
             out.name, len(client_ids), len(nodes), cfg.num_rounds, plan.name, _n_train(plan))
    rounds: list[dict] = []
    t_start = time.perf_counter()
    last_metrics: dict[int, MetricRecord] = {}

    error_replies: dict[int, list] = {}

    def keep_victims(server_round: int, replies: list) -> None:
        error_replies[server_round] = [r for r in replies if r.has_error()]  # a failed hop, a node's bad data
        if cfg.capture_victims and server_round == cfg.victim_round:
            victim_records = extract(replies)
            for r in victim_records:
                r.update(framework=cfg.framework, condition=cfg.condition, seed=cfg.seed, round=server_round)
            save(victim_records, out / "victims.pt")

    def keep_metrics(server_round: int, arrays, metrics: MetricRecord | None) -> None:
        if metrics is not None:
            last_metrics[server_round] = metrics
        if auditor is not None and arrays is not None:
            auditor.observe(flat_params(to_numpy(arrays)))  # the released (noised) model

    # Observed by composition: the wrapped strategy sees exactly the replies it would have seen.
    observed = RoundObserver(strategy, on_replies=keep_victims, on_result=keep_metrics)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict({k: v.to(device) for k, v in record_to_state(arrays).items()})
        acc, loss = evaluate(model, plan.x["test"], plan.y["test"], device, batch_size=128)  # 2.5x faster on CPU than 2048
        if server_round == 0:
            return MetricRecord({"test-acc": acc, "test-loss": loss})
        m = last_metrics.get(server_round, MetricRecord())
        elapsed = time.perf_counter() - t_start
        row = {"round": server_round, "test_acc": acc, "test_loss": loss, "elapsed_s": elapsed,
               **{k.replace("-", "_"): v for k, v in m.items()}}
        rounds.append(row)
        atomic_write_jsonl(out / "rounds.jsonl", rounds)
        eta = elapsed / server_round * (cfg.num_rounds - server_round)
        log.info("[%s] round %d/%d  acc %.4f  (%.1fs elapsed, ETA %.1fs)", out.name, server_round,
                 cfg.num_rounds, acc, elapsed, eta)
        return MetricRecord({"test-acc": acc, "test-loss": loss})

    observed.start(grid, initial, num_rounds=cfg.num_rounds, timeout=cfg.round_timeout,
                   train_config=config_record_for(cfg), evaluate_fn=evaluate_fn)

    save_state_dict(model, out / "final_model.pt")
    # Why each failed client failed, per round: the strategies' reply checks (FL), else the error replies
    # (sequential DFL's relay skips a failed hop and hands on its error reply).
    errors, problems = RoundErrors(), round_problems(strategy)
    for r in range(1, cfg.num_rounds + 1):
        if problems.get(r):
            errors.record_problems(r, problems[r], placement or {})
        else:
            errors.record(r, error_replies.get(r, []))
    acc_curve = [r["test_acc"] for r in rounds]
    summary = {"config_hash": run_hash(cfg), "run": out.name, "framework": cfg.framework,
               "dp": cfg.dp, "data_part": cfg.data_part, "clip_norm": cfg.clip_norm if cfg.dp else None,
               "eps_cal": cfg.eps_cal if cfg.dp else None, "seed": cfg.seed, "num_clients": cfg.num_clients,
               "num_rounds": cfg.num_rounds, "dataset": plan.name, "data_notes": plan.notes,
               "n_test": int(len(plan.y["test"])), "n_target_train": _n_train(plan),
               "wall_seconds": time.perf_counter() - t_start, "device": str(device),
               **curve_summary(acc_curve), "acc_curve": acc_curve, **deployment, **errors.summary()}
    if sampler is not None:
        summary.update(sampler.describe())
    sampled_row = None
    if isinstance(strategy, MatchedPerturbation):
        summary.update(strategy.clip_summary())
        summary.update(strategy.noise.describe())
        # The full-participation ledger at the same knobs (the seed paper's setting; the only one when q = 1).
        row = account(cfg.framework, cfg.clip_norm, cfg.eps_cal, cfg.num_clients, cfg.num_rounds,
                      cfg.delta_cal, cfg.delta_total)
        summary["accounting"] = asdict(row)
        summary["sigma_abs_nominal"] = row.sigma_abs
        if sampler is not None:
            # This run's ledger: amplified by sampling beside unamplified, for the population the server draws
            # from (the clients and any inserted audit canaries), whose cohort sized the noise.
            sampled_row = account_sampled(cfg.framework, cfg.clip_norm, cfg.eps_cal, sampler.population,
                                          cfg.num_rounds, cfg.delta_cal, cfg.delta_total, cfg.client_fraction,
                                          cfg.client_sampling)
            summary["accounting_sampled"] = asdict(sampled_row)
            summary["sigma_abs_nominal"] = sampled_row.sigma_abs
        summary["dp_fault"] = cfg.dp_fault or None  # issue 37: a deliberately broken mechanism says so
    if auditor is not None:
        from flower_apps.dfl_dp.audit_report import audit_result, write_audit

        assert canaries is not None and audit_rng is not None  # typing: set with the auditor (audit-canaries)
        # the study's ledger for the cohort the noise was sized by (N + inserted canaries; sampled: the amplified one)
        eps_study = (sampled_row.eps_total if sampled_row is not None else
                     account(cfg.framework, cfg.clip_norm, cfg.eps_cal, cfg.num_clients + int(canaries.inserted.sum()),
                             cfg.num_rounds, cfg.delta_cal, cfg.delta_total).eps_gdp_exact)
        audit = audit_result(cfg, canaries, auditor, {r: dict(m) for r, m in last_metrics.items()}, audit_rng,
                             eps_study)
        write_audit(out, audit)
        summary["audit"] = {"eps_formal_add_remove": audit["eps_formal_add_remove"], "verdict": audit["verdict"],
                            **{tm: {k: v[k] for k in ("eps_lower", "eps_point")}
                               for tm, v in audit["threat_models"].items()}}
    atomic_write_json(out / "summary.json", summary)
    close_run_folder(out)
    return summary


def cohort_sampler(cfg: DflDpConfig, noise: NoiseSource, num_canaries: int) -> CohortSampler | None:
    """The server's per-round cohort draw (None at client-fraction 1: full participation).

    Drawn from the server's own DP randomness (``noise``: OS entropy, or its local seed file), never from the
    run seed, which every message carries: amplification by sampling needs the draw secret from the clients.
    """
    if not cfg.sampled:
        return None
    rng = noise.numpy_generator(STREAM_CLIENT_SAMPLING, cfg.seed)
    return CohortSampler(cfg.client_sampling, cfg.client_fraction, cfg.num_clients, rng, num_extra=num_canaries)


#: audit canaries' norms as multiples of C (privacy.audit.canaries.make_canaries): above C, to test the clip
CANARY_NORM_RANGE = (2.0, 10.0)
#: The metrics of a train reply (client_app.train), and no others.
TRAIN_METRIC_KEYS = frozenset({"num-examples", "train-loss", "client-ids", "train-seconds", "cuda"})


def _n_train(plan) -> int:
    """Training examples of all clients (an ImagePlan's target-train, or the nodes' reported sizes)."""
    return plan.n_train if hasattr(plan, "n_train") else int(len(plan.y["target_train"]))


def config_record_for(cfg: DflDpConfig):
    """The ConfigRecord every train message carries."""
    return config_record(asdict(cfg))
