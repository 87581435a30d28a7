"""unlinkable-dfl's privacy report card: learning runs joined with the sender-linking measurements of the same mixnet."""

from __future__ import annotations

import math
from pathlib import Path

from flower_apps.common.report_card import (
    CardSpec,
    audited_epsilon,
    cell,
    column,
    finished_runs,
)
from flower_apps.common.results import read_json


def transport_key(*, mixnet: bool, num_nodes: int, topology: str, degree: int, max_hops: int, outbox: int,
                  mu: float, cover: bool, fragments: int) -> tuple:
    """What a sender-linking measurement depends on: one learning run and one transport result match
    when these agree (a full mesh has no degree; without a mixnet, hops, outbox, delay and cover do not exist)."""
    topo = (topology, None if topology == "full-mesh" else int(degree))
    if not mixnet:
        return (False, int(num_nodes), topo, int(fragments))
    return (True, int(num_nodes), topo, int(max_hops), int(outbox), float(mu), bool(cover), int(fragments))


def _mixnet_label(max_hops: int, outbox: int, mu: float, cover: bool) -> str:
    return f"mixnet K={max_hops}, O={outbox}, mu={mu:g}{'' if cover else ', no cover'}"


def transport_label(key: tuple) -> str:
    (topology, degree), n, frags = key[2], key[1], key[-1]
    net = _mixnet_label(*key[3:7]) if key[0] else "mixnet off"
    graph = "full mesh" if topology == "full-mesh" else f"{topology} d={degree}"
    return f"{net}; N={n}, {graph}, {frags} fragments/peer"


def _learning_key(s: dict) -> tuple | None:
    """The transport key of a learning run, or None when no transport measurement can stand for it:
    the baseline mode exchanges whole models, and partial exchange (share ratio < 1) sends fewer fragments."""
    if s.get("mode") != "unlinkable" or s.get("share_ratio", 1.0) != 1.0 or "fragments_per_update" not in s:
        return None
    return transport_key(mixnet=s["transport"] == "mixnet", num_nodes=s["num_nodes"], topology=s["topology"],
                         degree=s["degree"], max_hops=s["max_hops"], outbox=s["outbox"], mu=s["mu"],
                         cover=s["cover"], fragments=s["fragments_per_update"])


def _learning_label(s: dict) -> str:
    parts = [f"{s['dataset']} {s['model']}", f"T={s['num_rounds']}", s["encoding"], f"share {s['share_ratio']:g}",
             s["aggregator"], f"alpha {s['alpha']:g}"]
    if s.get("churn_leave"):
        parts.append(f"churn {s['churn_leave']:g}/{s['churn_join']:g}")
    if s.get("byzantine_fraction"):
        parts.append(f"byzantine {s['byzantine_fraction']:g} {s['byzantine_attack']}")
    if s.get("networked"):
        parts.append("node processes over TLS")
    return ", ".join(parts)


def collect_unlinkable_dfl(study_dir: Path) -> list[dict]:
    """Learning runs (utility) joined with the transport measurements (linking) of the same mixnet
    configuration (:func:`transport_key`): such a condition's row holds both, its records tagged
    ``part`` = learning / linking. Runs and measurements without a partner keep rows of their own."""
    learning = []
    for run, s in finished_runs(study_dir):
        key = _learning_key(s)
        if key is not None:
            cond = f"{transport_label(key)} | {_learning_label(s)}"
        else:
            net = (_mixnet_label(s["max_hops"], s["outbox"], s["mu"], s.get("cover", True))
                   if s["transport"] == "mixnet" else s["transport"])
            cond = f"learning only: {net}, {s.get('mode', '')}, N={s['num_nodes']}"
            if "dataset" in s:
                cond += f" | {_learning_label(s)}"
        learning.append((key, {"condition": cond, "part": "learning", "seed": s["seed"],
                               "utility": 100 * s["final_acc"], "eps": math.inf, "delta": None,
                               "audited_eps": audited_epsilon(run), "h_relay": s.get("h_relay_bits"),
                               "h_path": s.get("h_path_bits"), "no_mixnet": s["transport"] != "mixnet"}))
    # The same configuration and seed under two run names (e.g. netlearn's simulation twin of a scaling
    # run) is one measurement, not two seeds: the first one found counts.
    seen: set[tuple] = set()
    learning = [(k, rec) for k, rec in learning
                # set.add returns None: `not seen.add(...)` records the key and keeps the row (dedup idiom)
                if (rec["condition"], rec["seed"]) not in seen
                and not seen.add((rec["condition"], rec["seed"]))]  # type: ignore[func-returns-value]
    out = [rec for _, rec in learning]
    for f in sorted((study_dir / "transport").glob("*.json")):
        measured = read_json(f)
        spec, r = measured["spec"], measured["result"]
        key = transport_key(mixnet=spec["mixnet"], num_nodes=spec["num_nodes"], topology=spec["topology"],
                            degree=spec["degree"], max_hops=spec["max_hops"], outbox=spec["outbox"], mu=spec["mu"],
                            cover=spec["cover"], fragments=spec["fragments_per_peer"])
        rec = {"part": "linking", "seed": r["seed"], "utility": None, "eps": math.inf, "delta": None,
               "audited_eps": None,
               "linking_adv": max(r.get("agnostic_advantage", -math.inf), r.get("aware_advantage", -math.inf)),
               "h_relay": r.get("h_relay_bits"), "h_path": r.get("h_path_bits"),
               "h_relay_loc": r.get("h_relay_loc_bits") if r.get("mixnet") else None,  # as the study's table
               "no_mixnet": not r.get("mixnet")}
        partners = sorted({lrec["condition"] for k, lrec in learning if k == key})
        for k, lrec in learning:  # a joined row takes its entropies from the measurement, not twice
            if k == key:
                lrec.pop("h_relay", None)
                lrec.pop("h_path", None)
        out += [{**rec, "condition": c} for c in partners] or [{**rec, "condition": "linking only: "
                                                                  + transport_label(key)}]
    return out


def _h_relay_loc(recs: list[dict]) -> str:
    """Without a mixnet there is no relay location to hide: not applicable ("-"), not "not run"."""
    return "-" if all(r.get("no_mixnet") for r in recs) else cell(recs, "h_relay_loc", 2)


CARD = CardSpec("unlinkable-dfl", collect_unlinkable_dfl, columns=(
    column("linking advantage", "linking_adv"), column("H_relay (bits)", "h_relay", 2),
    column("H_path (bits)", "h_path", 2), ("H_relay^loc (bits)", _h_relay_loc)))
