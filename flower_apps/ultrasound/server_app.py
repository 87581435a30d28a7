"""Ultrasound ServerApp logic: one run (task, partition, backbone, method, DP setting, seed) -> one folder.

Modes: ``federated`` (Flower's FedAvg / FedProx / FedAdam over K clients, one per node),
``centralized`` (baseline on the union of the client training sets, same budget T x E epochs
and schedule, trained in the ServerApp), ``local`` (one model per client, trained by the
clients; one message each). Every mode evaluates on the shared global test set after
each round (or round-equivalent) and evaluates the final model(s) per client.

Folder: config.json, model.json, rounds.jsonl, summary.json, table2_partition, metrics,
per_client, accounting (DP), communication tables (CSV + Markdown) and figures; while a federated run
is unfinished, round_checkpoint.pt (strategies.resume: a rerun continues after its last finished round).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid

from datasets.base import DataError
from flower_apps.common.node_data import RoundErrors, discover
from flower_apps.common.results import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_jsonl,
    close_run_folder,
    discard_unstarted,
    open_run_folder,
    run_finished,
    run_folder,
    run_hash,
)
from flower_apps.common.torch_utils import pick_device, record_to_state, save_state_dict, state_to_record
from flower_apps.ultrasound import audit
from flower_apps.ultrasound.client_app import dp_settings
from flower_apps.ultrasound.config import ACTION, UltrasoundConfig
from flower_apps.ultrasound.data import UltrasoundData, build_data, coordinator_data, data_key
from flower_apps.ultrasound.models import create_model
from flower_apps.ultrasound.report import write_run_outputs
from flower_apps.ultrasound.strategy import build_ultrasound_strategy, train_rules
from flower_apps.ultrasound.train import client_seed, evaluate, lr_at_round, train_local
from privacy.dpsgd import DpSgdLedger, paper_sqrt_t_bound, rdp_epsilon
from strategies.base import FastGrid
from strategies.cohorts import build_messages, exchange, plan_cohorts, round_problems, wait_for_nodes
from strategies.records import number
from strategies.reply_rules import ReplyRules
from strategies.resume import (
    CHECKPOINT,
    checkpoint_arrays,
    drop_checkpoint,
    encode_checkpoint,
    load_checkpoint,
    restore_strategy_state,
    start_from_round,
)

log = logging.getLogger("flwr")
BYTES_PER_PARAM = 4  # float32


def run_dir(cfg: UltrasoundConfig) -> Path:
    """Where a run writes its results."""
    return run_folder("ultrasound", cfg)


def is_complete(cfg: UltrasoundConfig) -> bool:
    """True when this exact config already has a summary (sweeps resume)."""
    return run_finished(run_dir(cfg), cfg)


def communication(num_params: int, payload_bytes: int, num_clients: int, num_rounds: int) -> dict:
    """The paper's Table 4: 2 x |theta| x 4 bytes x K per round (down + up), and the actual payload."""
    per_round = 2 * num_params * BYTES_PER_PARAM * num_clients
    return {"num_params": num_params, "bytes_per_round": per_round, "mb_per_round": per_round / 2**20,
            "total_mb": per_round * num_rounds / 2**20,
            "payload_bytes_per_model": payload_bytes,  # params + buffers actually sent (e.g. BN statistics)
            "payload_mb_per_round": 2 * payload_bytes * num_clients / 2**20}


def accounting(ledgers: dict[int, DpSgdLedger], cfg: UltrasoundConfig) -> dict:
    """Per client: RDP epsilon (dp-accounting, actual q and steps) and the paper's sqrt(T) estimate."""
    rows = []
    for k, led in sorted(ledgers.items()):
        q = led.events[0].sample_rate if led.events else math.nan
        rows.append({"client": k, "sample_rate": q, "steps": led.total_steps,
                     "eps_rdp": rdp_epsilon(led.events, cfg.delta),
                     "eps_paper_sqrtT": paper_sqrt_t_bound(cfg.noise_multiplier, led.total_steps, cfg.delta)})
    eps = [r["eps_rdp"] for r in rows]
    return {"delta": cfg.delta, "noise_multiplier": cfg.noise_multiplier, "max_grad_norm": cfg.max_grad_norm,
            "accountant": "dp_accounting RdpAccountant, PoissonSampled(Gaussian) per step", "per_client": rows,
            "eps_rdp_max": max(eps) if eps else math.nan,
            "eps_paper_sqrtT_max": max((r["eps_paper_sqrtT"] for r in rows), default=math.nan)}


def _row(server_round: int, test: dict, val: dict | None, extra: dict) -> dict:
    row = {"round": server_round, **{f"test_{k}": v for k, v in test.items() if k != "confusion"}}
    if val:
        row.update({f"val_{k}": v for k, v in val.items() if k != "confusion"})
    row.update(extra)
    return row


def _per_client_eval(model, data: UltrasoundData, device) -> list[dict]:
    out = []
    for k in range(len(data.client_val)):
        xv, yv = data.client_val_data(k)
        m = evaluate(model, xv, yv, device) if len(yv) else {}
        out.append({"client": k, "n_val": int(len(yv)), **{k2: v for k2, v in m.items() if k2 != "confusion"}})
    return out


def server_main(grid: Grid, cfg: UltrasoundConfig) -> dict:
    """Run one configuration and write its results folder. Returns the summary."""
    from flower_apps.ultrasound.data import validate_data

    validate_data(cfg)  # unusable data fails here, in seconds: no run folder, no message sent
    audit_recs = audit.audit_records(cfg)  # us-audit-canaries > 0 only; refuses what it cannot observe
    out = open_run_folder(run_dir(cfg), cfg)
    (out / "summary.json").unlink(missing_ok=True)  # this config's old summary, if any: rewritten at the end
    # Deployment: the SuperNodes say which clients they hold; the coordinator keeps only test/ and val/.
    try:
        data, placement, deployment = (_node_local(grid, cfg) if cfg.node_local_data
                                       else (build_data(data_key(cfg)), None, {}))
    except DataError:  # refused before the first round (no usable node, one client claimed twice)
        discard_unstarted(out)
        raise
    device = pick_device(cfg.device)
    model, info = create_model(cfg.arch, data.num_classes, cfg.image_size, dp=cfg.dp_sgd, pretrained=cfg.pretrained,
                               weights_dir=cfg.weights_dir, seed=cfg.seed, dp_finetune=cfg.dp_finetune,
                               head_init=cfg.head_init)
    atomic_write_json(out / "model.json", info)
    initial = state_to_record(model)
    payload = int(sum(a.numpy().nbytes for a in initial.values()))
    t_start = time.perf_counter()
    log.info("ultrasound %s: %s on %s (%s), %d train / %d test, device %s", out.name, cfg.method, cfg.arch,
             info["weights"], len(data.y["train"]), len(data.y["test"]), device)
    if cfg.mode == "federated":
        res = _federated(grid, cfg, model, initial, data, device, audit_recs, placement)
    elif cfg.mode == "centralized":
        res = _centralized(cfg, model, data, device)
    else:
        res = _local_only(grid, cfg, initial, data, placement)
    rounds, per_client, final, ledgers, timing = res
    round_errors = timing.pop("round_errors", [])
    summary = {
        "config_hash": run_hash(cfg), "run": out.name, "method": cfg.method, "mode": cfg.mode,
        "algorithm": cfg.algorithm if cfg.mode == "federated" else None, "arch": cfg.arch,
        "paper_name": info["paper_name"], "weights": info["weights"], "pretrained_loaded": info["pretrained_loaded"],
        "dp_model_changes": len(info["dp_model_changes"]), "dp_finetune": info["dp_finetune"], "head_init": cfg.head_init,
        "num_trainable": info["num_trainable"], "task": cfg.task, "class_names": list(data.class_names),
        "partition": cfg.partition, "dataset": data.name, "synthetic": data.synthetic, "data_notes": data.notes,
        "image_size": cfg.image_size, "num_clients": cfg.num_clients, "num_rounds": cfg.num_rounds,
        "local_epochs": cfg.local_epochs, "batch_size": cfg.batch_size, "lr": cfg.lr, "seed": cfg.seed,
        "dp_sgd": cfg.dp_sgd, "max_grad_norm": cfg.max_grad_norm if cfg.dp_sgd else None,
        "noise_multiplier": cfg.noise_multiplier if cfg.dp_sgd else None,
        "grad_sample_mode": cfg.grad_sample_mode if cfg.dp_sgd else None,
        # DP-SGD noise is drawn by each training node from its own source; the server never learns a seed file.
        **({"noise_mode": cfg.noise_mode, "noise_seed_file": None} if cfg.dp_sgd else {}),
        "proximal_mu": cfg.proximal_mu if cfg.method == "fedprox" else None,
        "n_train": int(len(data.y["train"])), "n_val": int(len(data.y["val"])), "n_test": int(len(data.y["test"])),
        "device": str(device), "wall_seconds": time.perf_counter() - t_start,
        **{f"test_{k}": v for k, v in final.items() if k != "confusion"}, "confusion": final.get("confusion"),
        "best_accuracy": max((r["test_accuracy"] for r in rounds), default=final.get("accuracy")),
        "acc_curve": [r["test_accuracy"] for r in rounds], "f1_curve": [r.get("test_f1") for r in rounds],
        "per_client": per_client, "timing": timing, "round_errors": round_errors,
        "communication": communication(info["num_params"], payload, cfg.num_clients, cfg.num_rounds)
        if cfg.mode == "federated" else None,
        "accounting": accounting(ledgers, cfg) if cfg.dp_sgd else None,
    }
    if cfg.dp_fault:  # issue 37: a run with a deliberately broken mechanism says so (runs without keep their summary)
        summary["dp_fault"] = cfg.dp_fault
    if audit_recs is not None:  # the one-run DP-SGD audit, beside the RDP accountant's epsilon (docs/audit.md)
        summary["audit"] = audit.write_audit(out, cfg, audit_recs, summary["accounting"])
    summary.update(deployment)  # node-local runs: which node held which clients, which nodes failed and why
    write_run_outputs(out, summary, rounds, data.partition_rows(), info)
    atomic_write_json(out / "summary.json", summary)  # last: its presence marks the run complete
    drop_checkpoint(out)
    close_run_folder(out)
    return summary


def _timing(round_seconds: list[float], client_rows: list[dict]) -> dict:
    steps = [r["step-seconds"] for r in client_rows if r.get("steps")]
    train = [r["train-seconds"] for r in client_rows]
    cached = [r["trunk-cached"] for r in client_rows if "trunk-cached" in r]
    return {"mean_round_seconds": float(np.mean(round_seconds)) if round_seconds else math.nan,
            "mean_step_seconds": float(np.mean(steps)) if steps else math.nan,
            "mean_client_train_seconds": float(np.mean(train)) if train else math.nan,
            # share of client trainings whose classifier trained on cached trunk features (their step time is
            # a classifier step, not a whole-network one); None: a client did not say (older runs)
            "trunk_cached_share": float(np.mean(cached)) if cached and len(cached) == len(client_rows) else None,
            "round_seconds": round_seconds}


def _node_local(grid: Grid, cfg: UltrasoundConfig) -> tuple[UltrasoundData, dict[int, int], dict]:
    """Node-local data: discover who holds which clients; a node with unusable data is left out from the start.

    The paper's protocol is full participation: the clients the usable nodes hold form the fixed cohort
    (a node lost mid-run still fails the round loudly, strategy.FullCohort). The summary records the
    nodes, their clients and every node that failed, with its reason. Returns (the coordinator's data, the
    placement: logical client -> the node holding it, where its messages go, the deployment summary).
    """
    found = discover(grid, ACTION, ConfigRecord({"run-config": cfg.to_json()}), cfg.round_timeout, cfg.num_clients)
    data = coordinator_data(cfg, found.sizes(), found.label_counts())
    return data, found.placement, found.summary(range(cfg.num_clients))


def _cohort(grid: Grid, cfg: UltrasoundConfig, placement: dict[int, int] | None) -> list[int]:
    """The K logical clients: one node per client when K are connected, else shared round-robin."""
    if placement is not None:  # node-local data: the clients the nodes hold, each sent to its holder
        return sorted(placement)
    nodes = wait_for_nodes(grid, 1)
    log.info("ultrasound: %d logical clients on %d SuperNode(s)", cfg.num_clients, min(len(nodes), cfg.num_clients))
    return list(range(cfg.num_clients))


def _federated(grid: Grid, cfg: UltrasoundConfig, model, initial: ArrayRecord, data: UltrasoundData, device,
               audit_records: audit.AuditRecords | None = None, placement: dict[int, int] | None = None):
    cohort = _cohort(grid, cfg, placement)
    strategy = build_ultrasound_strategy(cfg.algorithm, proximal_mu=cfg.proximal_mu, server_lr=cfg.server_lr,
                                         beta1=cfg.beta1, beta2=cfg.beta2,
                                         buffer_keys=[n for n, _ in model.named_buffers()])
    strategy.set_cohort(cohort, ACTION, placement)
    strategy.reply_rules = train_rules(len(data.y["train"]))  # every reply validated before it is averaged
    model.to(device)
    rounds: list[dict] = []
    last = {"t": time.perf_counter()}
    out = run_dir(cfg)
    round_seconds: list[float] = []
    # Round checkpoints (strategies.resume): a rerun of this config continues after its last finished round.
    # Not with canaries: the audit's observations of earlier rounds live in this process only.
    resumable = not audit.is_audited(cfg)
    ck = load_checkpoint(out, run_hash(cfg)) if resumable else None
    resumed: list[int] = []
    if ck is not None:
        initial = checkpoint_arrays(ck)
        restore_strategy_state(strategy, ck["strategy"])
        rounds, round_seconds, resumed = ck["extra"]["rounds"], ck["extra"]["round_seconds"], ck["extra"]["resumed"]
        resumed = resumed + [ck["round"]]
        log.info("[%s] resuming after round %d of %d (round checkpoint)", out.name, ck["round"], cfg.num_rounds)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict({k: v.to(device) for k, v in record_to_state(arrays).items()})
        test = evaluate(model, data.x["test"], data.y["test"], device)
        if server_round == 0:
            last["t"] = time.perf_counter()
            return MetricRecord({"test-accuracy": test["accuracy"]})
        val = evaluate(model, data.x["val"], data.y["val"], device)
        # by client id, not reply arrival order: the mean train loss is then the same float every run (the
        # arrival order moved its last bit between runs of one seed)
        cm = [m for _, m in sorted(strategy.client_metrics.get(server_round, {}).items())]
        now = time.perf_counter()
        round_seconds.append(now - last["t"])
        last["t"] = now
        rounds.append(_row(server_round, test, val, {
            "round_seconds": round_seconds[-1], "lr": lr_at_round(cfg.lr, server_round, cfg.num_rounds),
            "train_loss": float(np.mean([m["train-loss"] for m in cm])) if cm else math.nan,
            "client_train_seconds_max": max((m["train-seconds"] for m in cm), default=math.nan),
            "step_seconds_mean": float(np.mean([m["step-seconds"] for m in cm])) if cm else math.nan,
            "clients_replied": len(cm)}))
        atomic_write_jsonl(out / "rounds.jsonl", rounds)
        if resumable and server_round < cfg.num_rounds:
            atomic_write_bytes(out / CHECKPOINT, encode_checkpoint(
                run_hash(cfg), server_round, arrays, strategy,
                {"rounds": rounds, "round_seconds": round_seconds, "resumed": resumed}))
        log.info("[%s] round %d/%d  acc %.4f  f1 %.4f  (%.1fs)", out.name, server_round, cfg.num_rounds,
                 test["accuracy"], test["f1"], round_seconds[-1])
        return MetricRecord({"test-accuracy": test["accuracy"]})

    # An audited run: the auditor's tap is the outermost layer (it takes the canary records out of the replies).
    outer = strategy if audit_records is None else audit.AuditTap(strategy, audit_records)
    # FastGrid is a Grid by duck typing (strategies.base), not a subclass
    result = start_from_round(outer, cast(Grid, FastGrid(grid)), initial, first_round=ck["round"] + 1 if ck else 1,
                              num_rounds=cfg.num_rounds, timeout=cfg.round_timeout,
                              train_config=ConfigRecord({"run-config": cfg.to_json()}), evaluate_fn=evaluate_fn)
    model.load_state_dict({k: v.to(device) for k, v in record_to_state(result.arrays).items()})
    # The released global model (keys of models.model_skeleton), for flower_apps/ultrasound/attacks.py.
    save_state_dict(model, run_dir(cfg) / "final_model.pt")
    final = evaluate(model, data.x["test"], data.y["test"], device)
    ledgers: dict[int, DpSgdLedger] = {k: DpSgdLedger() for k in range(cfg.num_clients)}
    all_rows = [m for r in sorted(strategy.client_metrics) for _, m in sorted(strategy.client_metrics[r].items())]
    if cfg.dp_sgd:
        for m in all_rows:
            ledgers[int(m["client-id"])].record(m["noise-multiplier"], m["sample-rate"], int(m["steps"]))
    timing = _timing(round_seconds, all_rows)
    timing["resumed_after_rounds"] = resumed  # wall_seconds then counts only this process's rounds
    errors = RoundErrors()  # every reply refused for its content, with its round, client and reason
    for r, probs in sorted(round_problems(strategy).items()):
        errors.record_problems(r, probs, placement or {})
    timing.update(errors.summary())
    return rounds, _per_client_eval(model, data, device), final, ledgers, timing


def _centralized(cfg: UltrasoundConfig, model, data: UltrasoundData, device):
    """Baseline: the union of the client training sets, T x E epochs, the same schedule, test per round-equivalent."""
    e = cfg.local_epochs
    rounds: list[dict] = []
    last = {"t": time.perf_counter()}
    round_seconds: list[float] = []

    def on_epoch_end(epoch: int, m) -> None:
        if epoch % e:
            return
        r = epoch // e
        now = time.perf_counter()
        round_seconds.append(now - last["t"])
        test = evaluate(m, data.x["test"], data.y["test"], device)
        rounds.append(_row(r, test, evaluate(m, data.x["val"], data.y["val"], device),
                           {"round_seconds": round_seconds[-1], "lr": lr_at_round(cfg.lr, r, cfg.num_rounds)}))
        atomic_write_jsonl(run_dir(cfg) / "rounds.jsonl", rounds)
        last["t"] = time.perf_counter()

    # The server trains here, so it is the noise authority: its own seed file ($PPFL_NOISE_SEED_FILE) when seeded.
    dp = dp_settings(cfg, received=state_to_record(model))
    # Every torch thread of this process (all cores unless OMP_NUM_THREADS / torch.set_num_threads says
    # otherwise): the clients' actors sit idle during a centralized run. Runs before 2026-12-02 capped this
    # at half the cores (one thread on 2 cores, twice the wall time; benchmarks/ultrasound_centralized_threads.py).
    # The count changes float summation order, so it is recorded (timing.torch_threads). Beside other CPU load
    # more threads are slower than one (OpenMP waits; docs/ultrasound.md): run with OMP_NUM_THREADS=1 there.
    threads = torch.get_num_threads()
    stats = train_local(model, data.x["train"], data.y["train"], epochs=cfg.num_rounds * e,
                        batch_size=cfg.batch_size, lr_for_epoch=lambda ep: lr_at_round(cfg.lr, -(-ep // e),
                                                                                        cfg.num_rounds),
                        device=device, seed=client_seed(cfg.seed, 0, 10**6), dp=dp, owners=data.train_owners(),
                        profiles=data.profiles, on_epoch_end=on_epoch_end, channels_last=cfg.channels_last)
    final = evaluate(model, data.x["test"], data.y["test"], device)
    ledger = DpSgdLedger()
    if dp is not None:
        assert stats.sample_rate is not None  # train_local reports it under DP-SGD
        ledger.record(cfg.noise_multiplier, stats.sample_rate, stats.steps)
    timing = _timing(round_seconds, [{"steps": stats.steps, "step-seconds": stats.step_seconds,
                                      "train-seconds": stats.seconds, "trunk-cached": int(stats.trunk_cached)}])
    timing["torch_threads"] = threads if device.type == "cpu" else None
    return rounds, _per_client_eval(model, data, device), final, {0: ledger}, timing


def _local_only(grid: Grid, cfg: UltrasoundConfig, initial: ArrayRecord, data: UltrasoundData,
                placement: dict[int, int] | None = None):
    """Baseline: each client trains its own model for T x E epochs (one message per client)."""

    conf = ConfigRecord({"run-config": cfg.to_json(), "server-round": 0})
    plan = plan_cohorts(_cohort(grid, cfg, placement), list(grid.get_node_ids()), 1, placement)
    # A local-only reply carries metrics, no model (strategies.reply_rules); per-client scores may be NaN
    # (an AUC on a one-class validation split), sizes are bounded by the plan.
    rules = ReplyRules(returns_model=False, max_examples=max(1, len(data.y["train"])),
                       nonfinite_metrics=frozenset(f"{s}-{k}" for s in ("test", "val")
                                                   for k in ("accuracy", "f1", "precision", "recall", "specificity",
                                                             "auc")))
    checked = exchange(grid, build_messages(plan, initial, conf, ACTION), cfg.round_timeout, array_claims="none",
                       rules=rules)
    if checked.problem_of:
        cid, why = min(checked.problem_of.items())
        raise RuntimeError(f"local-only: {len(checked.problem_of)} of {cfg.num_clients} clients failed "
                           f"(client {cid}: {why})")
    rows = [dict(checked.reply_of[c].content["metrics"]) for c in checked.contributors]
    c = len(data.class_names)
    keys = ("accuracy", "f1", "precision", "recall", "specificity", "auc")
    per_client = [{"client": int(number(r["client-id"])), "n_train": int(number(r["num-examples"])),
                   **{f"test_{k}": r[f"test-{k}"] for k in keys},
                   **{k: r.get(f"val-{k}", math.nan) for k in keys}} for r in rows]
    final = {k: float(np.nanmean([r[f"test-{k}"] for r in rows])) for k in keys}
    final["confusion"] = np.sum([np.asarray(r["confusion"]).reshape(c, c) for r in rows], 0).tolist()
    curves = np.asarray([r["acc-curve"] for r in rows])
    rounds = [{"round": t + 1, "test_accuracy": float(curves[:, t].mean())} for t in range(curves.shape[1])]
    atomic_write_jsonl(run_dir(cfg) / "rounds.jsonl", rounds)
    ledgers = {k: DpSgdLedger() for k in range(cfg.num_clients)}
    if cfg.dp_sgd:
        for r in rows:
            ledgers[int(number(r["client-id"]))].record(number(r["noise-multiplier"]), number(r["sample-rate"]),
                                                        int(number(r["steps"])))
    return rounds, per_client, final, ledgers, _timing([], rows)
