"""unlinkable-dfl ServerApp: the world (virtual time, network, churn), never an aggregator.

Per round: (1) churn: departed nodes may rejoin; (2) each live node gets a ``train``
step (a ``train.unlinkable_dfl`` message, ``phase = train``) with its current model and its live
learning neighbours, and answers with its
trained model, its encoded fragments and the (receiver, fragment) pairs it wants to send;
(3) the world pushes those payloads through the transport (the Sphinx mixnet simulator,
the direct "mixnet off" transport, or instant delivery for the baseline), crashing the
nodes scheduled to leave; (4) each node still alive gets an ``aggregate`` step (``train.unlinkable_dfl``,
``phase = aggregate``: both steps make the node's new model, so both are Flower train messages) with
its trained model and the anonymous payloads its inbox received, aggregates its own pool
and returns its new model and test accuracy. The world keeps every node's model between
rounds: it plays the nodes' memory as well as the network, which is why node state can
live here without any central aggregation.

Results folder: config.json, rounds.jsonl (per round: mean/min/max accuracy over live
honest nodes, completeness, coverage, CPU, bytes, packets, virtual durations),
summary.json (and the curious-recipient analysis when enabled).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from attacks.linking.content import CuriousRecipientRecorder
from datasets.base import DataError
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
from flower_apps.common.torch_utils import record_to_state, state_to_record
from flower_apps.unlinkable_dfl.config import ACTION, UdflConfig
from flower_apps.unlinkable_dfl.data import build_data_plan, data_key
from flower_apps.unlinkable_dfl.models import build_model, shareable_keys, state_vector
from flower_apps.unlinkable_dfl.node import fragment_layout
from flower_apps.unlinkable_dfl.world import MEANINGFUL, World, honest_mean
from mixnet.metrics import h_path, h_relay
from registry import streams
from strategies.cohorts import build_messages, exchange, plan_cohorts, planned_clients, wait_for_nodes
from strategies.records import client_key
from strategies.reply_rules import ReplyRules

log = logging.getLogger("flwr")


def run_dir(cfg: UdflConfig) -> Path:
    """Where a run writes its results."""
    return run_folder("unlinkable-dfl", cfg)


def is_complete(cfg: UdflConfig) -> bool:
    """True when this exact config already has a summary (sweeps resume)."""
    return run_finished(run_dir(cfg), cfg)


def _byzantine_nodes(cfg: UdflConfig) -> set[int]:
    k = int(round(cfg.byzantine_fraction * cfg.num_nodes))
    if not k:
        return set()
    return set(streams.rng("unlinkable-dfl.byzantine-nodes", cfg.seed).choice(cfg.num_nodes, k, replace=False).tolist())


def reply_rules(cfg: UdflConfig, phase: str) -> ReplyRules:
    """What a node's reply must satisfy before the coordinator uses it (strategies.reply_rules).

    Every model must have the keys, shapes and dtypes of the model the node was sent. Not required finite:
    each node's model is its own state, which the coordinator only carries between phases and never
    averages, and a node driven to NaN by Byzantine fragments (FragFedAvg) is a result the study measures;
    likewise its metrics describe only itself. What the coordinator acts on is checked: a train reply's
    fragment sends (``frags.<id>``: byte payloads, destinations that are nodes, indices into its payloads)
    and a metrics record for every node it speaks for.
    """

    def content(reply, planned: tuple[int, ...]) -> str | None:
        c = reply.content
        for node in planned:
            if f"metrics.{node}" not in c.metric_records:
                return f"no metrics.{node} record"
            if phase != "train":
                continue
            rec = c.config_records.get(f"frags.{node}")
            if rec is None:
                return f"no frags.{node} record"
            try:
                frags = list(rec["fragments"]) if "fragments" in rec else []
                dst, idx = list(rec["dst"]) if "dst" in rec else [], list(rec["idx"]) if "idx" in rec else []
            except TypeError:
                return f"frags.{node}: malformed"
            if not all(isinstance(f, bytes) for f in frags):
                return f"frags.{node}: fragments must be bytes"
            if len(dst) != len(idx):
                return f"frags.{node}: {len(dst)} destinations for {len(idx)} fragment indices"
            if any(isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < cfg.num_nodes or d == node
                   for d in dst):
                return f"frags.{node}: a destination is not another node in [0, {cfg.num_nodes})"
            if any(isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(frags) for k in idx):
                return f"frags.{node}: a fragment index is outside [0, {len(frags)})"
        return None

    return ReplyRules(finite_arrays=False, finite_metrics=False, content_check=content)


def _exchange(grid: Grid, cfg: UdflConfig, phase: str, round_: int, nodes: list[int], per_node: dict,
              supernodes: list[int], extra: dict | None = None, placement: dict[int, int] | None = None,
              errors: RoundErrors | None = None) -> tuple[dict[str, Any], set[int]]:
    """One message per cohort of logical nodes; returns the merged reply records and the failed nodes.

    Each message carries the records of the nodes it asks for (``client-ids``); a reply must
    carry ``client.<id>`` for exactly those nodes (strategies.cohorts.check_replies). In a
    simulation any failure is a bug and stops the run; with node-local data (``placement``) a
    failed SuperNode's logical nodes sit the phase out, like crashed nodes, and ``errors`` keeps why.
    """
    # One message type (train) with two steps: "phase" names which (client_app.train dispatches on it).
    common = {"run-config": cfg.to_json(), "phase": phase, "server-round": round_, **(extra or {})}
    cohorts = plan_cohorts(nodes, supernodes, cfg.clients_per_message, placement)
    messages = build_messages(cohorts, ArrayRecord(), ConfigRecord(common), ACTION)
    for msg in messages:
        del msg.content["arrays"]
        for node in planned_clients(msg):
            for key, val in per_node[node].items():
                if isinstance(val, (ArrayRecord, ConfigRecord)):
                    msg.content[key] = val
                else:
                    msg.content["config"][key] = val
    checked = exchange(grid, messages, timeout=cfg.round_timeout, rules=reply_rules(cfg, phase))
    # A reply refused for its content (hostile or broken) sits the phase out and is recorded, in a simulation
    # too; any other failure in a simulation is a bug and stops the run.
    lost = {n: why for n, why in checked.problem_of.items() if placement is None and n not in checked.rejected_clients}
    if checked.problem_of and not lost:
        log.warning("round %d, phase %s: %d node(s) failed and sit it out: %s", round_, phase,
                    len(checked.problem_of), min(checked.problem_of.items()))
        if errors is not None:
            errors.record_problems(round_, {n: f"{phase}: {why}" for n, why in checked.problem_of.items()},
                                   placement or {})
    elif checked.problem_of:
        node, why = min(lost.items())
        raise RuntimeError(f"{len(checked.problem_of)} node(s) failed in phase {phase}, round {round_}; "
                           f"node {node}: {why}")
    merged: dict[str, Any] = {}  # Array/Config/MetricRecords by key: the caller reads each as its phase wrote it
    for reply in checked.valid:
        for key, rec in reply.content.items():
            merged[key] = rec
    return merged, set(checked.problem_of)


def server_main(grid: Grid, cfg: UdflConfig, network: bool = False) -> dict:
    """Run one configuration through Flower and write its results folder. Returns the summary.

    ``network``: carry the fragments over N node processes on TLS (``World(network=True)``)
    instead of the discrete-event simulator (``netlearn.py``; not a run key, so that the
    results of every simulated run keep their identity).
    """
    from flower_apps.unlinkable_dfl.data import validate_data

    # Unusable data fails here, in seconds: no run folder, no message sent. With node-local data the
    # coordinator holds only its test set (eval-data-path); the SuperNodes say which nodes they hold.
    checked_plan = validate_data(cfg)
    out = open_run_folder(run_dir(cfg), cfg)
    t_start = time.perf_counter()
    plan = checked_plan if cfg.node_local_data else build_data_plan(data_key(cfg))
    c, h, _ = plan.image_shape
    init = build_model(cfg.model, cfg.seed, c, plan.num_classes, h)
    num_values = sum(init.state_dict()[k].numel() for k in shareable_keys(init))
    layout = fragment_layout(num_values, cfg.payload_size, cfg.encoding)
    models: dict[int, ArrayRecord] = {i: state_to_record(init) for i in range(cfg.num_nodes)}
    world = World(cfg, network=network)
    try:
        return _run_rounds(grid, cfg, out, t_start, plan, init, num_values, layout, models, world)
    finally:
        world.close()


def _run_rounds(grid, cfg, out, t_start, plan, init, num_values, layout, models, world) -> dict:
    """The round loop of :func:`server_main` (split out so that the world is always closed)."""
    byzantine = _byzantine_nodes(cfg)
    supernodes = wait_for_nodes(grid, 1)
    placement, deployment, errors = None, {}, RoundErrors()
    if cfg.node_local_data:
        try:
            found = discover(grid, ACTION, ConfigRecord({"run-config": cfg.to_json()}), cfg.round_timeout, cfg.num_nodes)
        except DataError:  # refused before the first round (no usable node, one client claimed twice)
            discard_unstarted(out)
            raise
        placement, deployment = found.placement, found.summary(range(cfg.num_nodes))
        world.exclude(deployment["missing_clients"])  # no SuperNode holds their data: absent all run
    curious = CuriousRecipientRecorder(cfg.curious_node, layout) if cfg.curious_node >= 0 else None
    log.info("unlinkable-dfl %s: %d nodes (%d Byzantine) on %d SuperNodes, %d values -> %d fragments (%s), "
             "transport %s", out.name, cfg.num_nodes, len(byzantine), len(supernodes), num_values, layout.count,
             cfg.encoding, world.kind)
    rounds: list[dict] = []
    for t in range(1, cfg.num_rounds + 1):
        rejoined = world.rejoin()
        live = sorted(world.alive)
        peers = {i: world.learning_neighbours(i) for i in live}
        train, failed = _exchange(grid, cfg, "train", t, live,
                                  {i: {client_key(i): models[i], f"peers.{i}": peers[i]} for i in live}, supernodes,
                                  {"byzantine-ids": sorted(byzantine)}, placement, errors)
        live = [i for i in live if i not in failed]  # a failed node sends nothing and keeps its model
        sends, trained, tm = [], {}, {}
        for i in live:
            rec = train[f"frags.{i}"]
            frags = list(rec["fragments"])
            sends += [(i, int(d), bytes(frags[int(k)])) for d, k in zip(rec["dst"], rec["idx"])]
            trained[i] = train[client_key(i)]
            tm[i] = train[f"metrics.{i}"]
            if curious is not None:
                curious.observe_sender(t, i, [bytes(f) for f in frags])
        departures = world.plan_departures()
        delivery = world.deliver(t, sends, departures)
        agg_nodes = [i for i in live if i in world.alive]
        agg, failed = _exchange(grid, cfg, "aggregate", t, agg_nodes,
                                {i: {client_key(i): trained[i],
                                     f"inbox.{i}": ConfigRecord({"fragments": delivery.inbox.get(i, [])})}
                                 for i in agg_nodes}, supernodes, None, placement, errors)
        agg_nodes = [i for i in agg_nodes if i not in failed]
        am = {}
        for i in agg_nodes:
            models[i] = agg[client_key(i)]
            am[i] = agg[f"metrics.{i}"]
            if cfg.node_local_data:  # the coordinator evaluates (SuperNodes hold no test set)
                am[i] = _evaluate_on_coordinator(cfg, plan, init, models[i], am[i])
        if curious is not None and cfg.curious_node in agg_nodes:
            curious.observe_recipient(t, _vector(trained[cfg.curious_node], init),
                                      delivery.inbox.get(cfg.curious_node, []),
                                      delivery.sent_by.get(cfg.curious_node, []))
        row = _round_row(cfg, t, live, agg_nodes, byzantine, tm, am, delivery, rejoined, layout.count)
        row["elapsed_s"] = time.perf_counter() - t_start
        rounds.append(row)
        atomic_write_jsonl(out / "rounds.jsonl", rounds)
        log.info("[%s] round %d/%d  acc %.4f  completeness %.3f  network %.2fs (%s)  (%.0fs elapsed)",
                 out.name, t, cfg.num_rounds, row["test_acc"], row["completeness"], row["network_virtual_s"],
                 "virtual" if world.net is None else "real", row["elapsed_s"])
    summary = _summary(cfg, out.name, plan, rounds, num_values, layout, byzantine, time.perf_counter() - t_start)
    summary["networked"] = world.net is not None  # node processes over TLS (network_s in real seconds)
    summary.update(deployment)
    if cfg.node_local_data or errors.rows:
        summary.update(errors.summary())
    if curious is not None:
        summary["content_linking"] = curious.analyse()
    atomic_write_json(out / "summary.json", summary)
    close_run_folder(out)
    return summary


def _evaluate_on_coordinator(cfg: UdflConfig, plan, init, record: ArrayRecord, metrics) -> dict:
    """A node's aggregated model on the coordinator's test subset (what the simulated node computes itself)."""
    from flower_apps.unlinkable_dfl.node import evaluate

    model = copy.deepcopy(init)
    model.load_state_dict(record_to_state(record))
    acc, loss = evaluate(model, *plan.test_subset(cfg.eval_samples))
    return {**dict(metrics), "test-acc": acc, "test-loss": loss}


def _vector(record: ArrayRecord, model) -> np.ndarray:
    return state_vector(record_to_state(record), shareable_keys(model))


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(xs)) if xs else float("nan")


def _round_row(cfg, t, live, agg_nodes, byzantine, tm, am, d, rejoined, num_fragments) -> dict:
    honest = [i for i in agg_nodes if i not in byzantine]
    accs = {i: float(am[i]["test-acc"]) for i in agg_nodes}
    cpu = {i: float(tm[i]["train-cpu-s"]) + float(tm[i]["encode-cpu-s"]) + d.cpu_s.get(i, 0.0)
           + (float(am[i]["aggregate-cpu-s"]) if i in am else 0.0) for i in live}
    meaningful = {i: sum(d.packets_sent.get(i, {}).get(k, 0) for k in MEANINGFUL) for i in live}
    # Median node: robust to one-off warm-up costs (first optimizer, first data load) in a process.
    train_s = float(np.median([float(tm[i]["train-wall-s"]) for i in live]))
    agg_s = float(np.median([float(am[i]["aggregate-wall-s"]) for i in agg_nodes])) if agg_nodes else 0.0
    return {
        "round": t, "live_nodes": len(live), "aggregating_nodes": len(agg_nodes), "rejoined": rejoined,
        "departed": d.departed,
        "test_acc": honest_mean(accs, byzantine), "test_acc_min": min((accs[i] for i in honest), default=float("nan")),
        "test_acc_max": max((accs[i] for i in honest), default=float("nan")),
        "test_loss": _mean(float(am[i]["test-loss"]) for i in honest),
        "train_loss": _mean(float(tm[i]["train-loss"]) for i in live if i not in byzantine),
        "fragments_per_update": num_fragments,
        "diverged_nodes": int(sum(float(tm[i]["diverged"]) for i in live)),
        "payloads_intended": d.intended, "payloads_delivered": d.delivered,
        "completeness": d.delivered / d.intended if d.intended else 1.0,
        "coverage": _mean(float(am[i]["coverage"]) for i in honest),
        "krum_ranges": int(sum(float(am[i]["krum-ranges"]) for i in agg_nodes)),
        "krum_fallback_ranges": int(sum(float(am[i]["fallback-ranges"]) for i in agg_nodes)),
        "duplicates": int(sum(float(am[i]["duplicates"]) for i in agg_nodes)),
        "stale": int(sum(float(am[i]["stale"]) for i in agg_nodes)),
        "cpu_s_per_node": float(np.median(list(cpu.values()))),
        "mixnet_cpu_s_per_node": _mean(d.cpu_s.get(i, 0.0) for i in live),
        "bytes_per_node": _mean(d.bytes_sent.get(i, 0) for i in live),
        "meaningful_packets_per_node": _mean(meaningful.values()),
        "cover_packets_per_node": _mean(d.packets_sent.get(i, {}).get("cover", 0) for i in live),
        "relay_packets_per_node": _mean(d.packets_sent.get(i, {}).get("relay", 0) for i in live),
        "network_virtual_s": d.network_s, "train_wall_s_median": train_s, "aggregate_wall_s_median": agg_s,
        "round_virtual_s": train_s + d.network_s + agg_s,
        "rtt_s_mean": _mean(d.rtt_s),
    }


def _summary(cfg, name, plan, rounds, num_values, layout, byzantine, wall) -> dict:
    acc = [r["test_acc"] for r in rounds]
    keys = ("completeness", "coverage", "cpu_s_per_node", "bytes_per_node", "meaningful_packets_per_node",
            "network_virtual_s", "round_virtual_s", "rtt_s_mean", "mixnet_cpu_s_per_node", "live_nodes")
    out = {
        "config_hash": run_hash(cfg), "run": name, "seed": cfg.seed, "num_nodes": cfg.num_nodes,
        "num_rounds": cfg.num_rounds, "dataset": plan.name, "data_notes": plan.notes, "model": cfg.model,
        "transport": cfg.transport, "mode": cfg.mode, "encoding": cfg.encoding, "share_ratio": cfg.share_ratio,
        "aggregator": cfg.aggregator, "krum_budget": cfg.krum_budget, "alpha": cfg.alpha, "topology": cfg.topology,
        "degree": cfg.degree,
        "max_hops": cfg.max_hops, "outbox": cfg.outbox, "mu": cfg.mu, "cover": cfg.cover,
        "churn_leave": cfg.churn_leave, "churn_join": cfg.churn_join, "byzantine_fraction": cfg.byzantine_fraction,
        "byzantine_attack": cfg.byzantine_attack, "byzantine_nodes": sorted(byzantine),
        "num_values": num_values, "fragments_per_update": layout.count, "values_per_fragment": layout.values_per_fragment,
        "final_acc": acc[-1], "best_acc": max(acc), "acc_curve": acc, "wall_seconds": wall,
        "krum_fallback_ranges": sum(r["krum_fallback_ranges"] for r in rounds),
        "krum_ranges": sum(r["krum_ranges"] for r in rounds),
    }
    for k in keys:
        out[f"mean_{k}"] = _mean(r[k] for r in rounds)
    if cfg.transport == "mixnet":
        out["h_relay_bits"] = h_relay(cfg.outbox)
        out["h_path_bits"] = h_path(cfg.outbox, cfg.max_hops)
    return out
