"""The unlinkable-dfl parts of docs/unlinkable_dfl.md generated from kept transport measurements.

Data: ``results_reduced/unlinkable-dfl/transport/*.json`` (the reduced linking grid, N = 16, seeds 0-2,
rerun for issue 39: ``python -m flower_apps.unlinkable_dfl.sweep --experiment linking --seeds 3
--results-dir results_reduced``) and ``wall_notes.json`` beside it (the rerun's wall time and load).
Rendered: the "Which formula" table, the measured sender-linking advantage beside our chain-following
bound (:mod:`mixnet.theory`) and the multiplicity form of ``gamma_T`` (:mod:`mixnet.theory_multiplicity`,
issue 39's reading of the paper), each under its own name. See :mod:`flower_apps.common.doc_blocks`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flower_apps.common.results import read_json

REDUCED = Path("results_reduced") / "unlinkable-dfl"
ADVERSARIES = ("agnostic", "aware")


LINKING_SEEDS = range(3)  # the kept linking grid: --seeds 3


def linking_runs(root: Path, folder: Path = REDUCED) -> dict[str, list[dict[str, Any]]]:
    """Config label -> its transport results (one per seed, by seed), in the grid's order (off, then K, O).

    Only the linking experiment's own measurements (its plan's specs x :data:`LINKING_SEEDS`): the transport
    folder also holds the other experiments' (scaling, cost, topology), at other N and degrees."""
    from dataclasses import asdict

    from flower_apps.unlinkable_dfl.sweep import TrafficSpec, plan, traffic_path

    specs = [TrafficSpec(**{**asdict(s), "seed": seed}) for seed in LINKING_SEEDS for s in plan("linking", "reduced").traffic]
    paths = [traffic_path(str(root / folder.parent), s) for s in specs]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} of the linking grid's {len(paths)} transport measurements are not "
                                f"kept under {folder}/transport, e.g. {missing[0]}")
    rows = [read_json(p)["result"] for p in paths]
    missing = [r["label"] for r in rows if "agnostic_trace_mult_bound" not in r]
    if missing:
        raise ValueError(f"transport results without the multiplicity columns (measured before issue 39): {missing}")
    out: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["mixnet"], r["max_hops"], r["outbox"], r["mu"], r["seed"])):
        out.setdefault(r["label"], []).append(r)
    return out


def _mean(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(float(r[key]) for r in runs)


def _pair(fmt: Callable[[str], str]) -> str:
    """One cell, topology-agnostic / topology-aware."""
    return " / ".join(fmt(adv) for adv in ADVERSARIES)


def _bound(runs: list[dict[str, Any]], adv: str, bound: str, measured: str = "advantage", digits: int = 3) -> str:
    """Mean of a bound over seeds; bold when any seed's measured value exceeds that seed's bound."""
    vals = [(r[f"{adv}_{measured}"], r[f"{adv}_{bound}"]) for r in runs]
    if any(math.isnan(b) for _, b in vals):  # the bound is not defined on any target of a seed
        return "-"
    text = f"{statistics.fmean(b for _, b in vals):.{digits}f}"
    return f"**{text}**" if any(a > b + 1e-9 for a, b in vals) else text


def _on_them(runs: list[dict[str, Any]], adv: str) -> str:
    """Measured advantage on the targets whose multiplicity gamma_T < 1, beside their mean gamma_T."""
    if any(math.isnan(r[f"{adv}_trace_mult_informative_advantage"]) for r in runs):
        return "-"
    measured = f"{_mean(runs, f'{adv}_trace_mult_informative_advantage'):.3f}"
    return f"{measured} vs {_bound(runs, adv, 'trace_mult_informative_bound', 'trace_mult_informative_advantage')}"


def _row(label: str, runs: list[dict[str, Any]]) -> list[str]:
    h = (f"{runs[0]['ideal_h_inf_bits']:.2f} / {_mean(runs, 'relay_h_inf_bits'):.2f} / "
         f"{_mean(runs, 'aware_relay_h_inf_bits'):.2f}")
    # at K = 1 no path crosses a relay: an ideal relay min-entropy has nothing to apply to
    no_relay = runs[0]["mixnet"] and runs[0]["max_hops"] == 1
    return [label, h, _pair(lambda a: f"{_mean(runs, f'{a}_advantage'):.3f}"),
            _pair(lambda a: _bound(runs, a, "ideal_bound")),
            _pair(lambda a: _bound(runs, a, "trace_bound")),
            _pair(lambda a: _bound(runs, a, "trace_bound_c0.25")),
            _pair(lambda a: f"{_mean(runs, f'{a}_trace_mult_trajectories'):.1f}"),
            "n/a (no relay)" if no_relay else _pair(lambda a: _bound(runs, a, "ideal_mult_bound", digits=2)),
            _pair(lambda a: _bound(runs, a, "trace_mult_bound", digits=2)),
            _pair(lambda a: f"{_mean(runs, f'{a}_trace_mult_informative'):.2f}"),
            _pair(lambda a: _on_them(runs, a))]


def theory_table(root: Path) -> str:
    """docs/unlinkable_dfl.md's "Which formula" table: mean over seeds, topology-agnostic / topology-aware."""
    head = ["config", "H_inf ideal / trace / trace aware (bits)", "measured advantage",
            "chain bound (ours), ideal H_inf", "chain bound (ours), trace H_inf", "chain bound (ours), c = 0.25",
            "mean \\|Gamma_T\\|", "multiplicity gamma_T, ideal H_inf", "multiplicity gamma_T, trace H_inf",
            "targets with multiplicity gamma_T < 1", "advantage on them vs their gamma_T"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_row(label, runs)) + " |" for label, runs in linking_runs(root).items()]
    return "\n".join(lines)


def theory_values(root: Path) -> Mapping[str, str]:
    """Values the "Which formula" prose quotes: seeds, targets, margins, the rerun's wall time."""
    runs = [r for rs in linking_runs(root).values() for r in rs]
    mixed = [r for r in runs if r["mixnet"] and r["max_hops"] > 1]
    out = {"seeds": str(len({r["seed"] for r in runs})),
           "targets": _range([r["agnostic_targets"] for r in runs], "{:d}"),
           "chain_margin": f"{max(r[f'{a}_advantage'] - r[f'{a}_trace_bound'] for r in runs for a in ADVERSARIES):.3f}",
           "chain_margin_mixed": f"{max(r[f'{a}_advantage'] - r[f'{a}_trace_bound'] for r in mixed for a in ADVERSARIES):.3f}",
           "mult_min": f"{min(r[f'{a}_trace_mult_bound'] for r in mixed for a in ADVERSARIES):.2f}",
           "mult_max": f"{max(r[f'{a}_trace_mult_bound'] for r in mixed for a in ADVERSARIES):.0f}",
           "mult_over": str(sum(r[f"{a}_trace_mult_informative_advantage"] > r[f"{a}_trace_mult_informative_bound"]
                                for r in mixed for a in ADVERSARIES)),
           "mult_cells": str(2 * len(mixed))}
    relayed = {label: rs for label, rs in linking_runs(root).items() if rs[0]["mixnet"] and rs[0]["max_hops"] > 1}
    trace = {label: statistics.fmean(r["relay_h_inf_bits"] for r in rs) for label, rs in relayed.items()}
    aware = {label: statistics.fmean(r["aware_relay_h_inf_bits"] for r in rs) for label, rs in relayed.items()}
    out["trace_h_inf"] = _range(list(trace.values()), "{:.1f}")  # the relays' trace min-entropy, mixed configs
    out["aware_h_inf"] = _range(list(aware.values()), "{:.1f}")
    for label, rs in relayed.items():
        if rs[0]["max_hops"] == 2:
            out[f"trace_h_inf.k2.o{rs[0]['outbox']}"] = f"{trace[label]:.1f}"
    notes = read_json(root / REDUCED / "wall_notes.json")
    out["wall_min"] = f"{notes['wall_seconds'] / 60:.1f}"
    out["load"] = str(notes["load"])
    return out


def _range(values: list[Any], fmt: str = "{:.2f}") -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def linking_values(root: Path) -> Mapping[str, str]:
    """Row 7 of the results table: accuracy and baseline 1/|U_T| per path length, means over seeds (ranges
    over the outbox sizes O of that length), for both adversaries."""
    groups: dict[str, list[list[dict[str, Any]]]] = {}
    for runs in linking_runs(root).values():
        r = runs[0]
        groups.setdefault("off" if not r["mixnet"] else f"k{r['max_hops']}", []).append(runs)
    out = {}
    for name, configs in groups.items():
        for adv, tag in (("agnostic", ""), ("aware", "aware_")):
            for key, short in (("accuracy", "acc"), ("baseline", "base"), ("advantage", "adv")):
                out[f"{name}.{tag}{short}"] = _range([_mean(runs, f"{adv}_{key}") for runs in configs], "{:.3f}")
    return out


BLOCKS = {"udfl-linking-theory-table": theory_table}
VALUES = {"udfl-linking-theory": theory_values, "udfl-linking": linking_values}


# --- the reduced-scale results table, the topology supplement, the datasets table (issue 39) ----------------
# Data: each experiment's tables under results_reduced/unlinkable-dfl/<experiment>-reduced[-<dataset>]/, written by
# ``python -m flower_apps.unlinkable_dfl.sweep --experiment <name> --seeds 1 --results-dir results_reduced`` from the
# kept run folders (runs/) and transport measurements (transport/) beside them; ``--report-only`` rebuilds them
# (tests/unlinkable_dfl/test_udfl_kept_tables.py checks that it gives the kept files).

def _table(root: Path, folder: str, stem: str) -> list[dict[str, str]]:
    """A kept report table (CSV) of one experiment folder, as rows of strings."""
    import csv

    path = root / REDUCED / folder / f"{stem}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"kept table {path.relative_to(root)} is missing (run the experiment: "
                                f"python -m flower_apps.unlinkable_dfl.sweep --experiment {folder.split('-')[0]} "
                                "--seeds 1 --results-dir results_reduced)")
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _one(rows: list[dict[str, str]], **match: str) -> dict[str, str]:
    got = [r for r in rows if all(r[k] == v for k, v in match.items())]
    if len(got) != 1:
        raise ValueError(f"expected one kept row with {match}, found {len(got)}")
    return got[0]


def _pp(a: str, b: str) -> str:
    return f"{float(a) - float(b):+.2f} pp"


def _scaling_cell(root: Path) -> str:
    rows = _table(root, "scaling-reduced", "table_scaling")
    cells = []
    for n in ("8", "16", "32"):
        acc = [_one(rows, N=n, transport=t)["final acc (%)"] for t in ("mixnet on", "mixnet off",
                                                                        "baseline (non-anonymous DFL)")]
        cells.append(f"N = {n}: {' / '.join(acc)} %")
    comp = sorted({float(r["completeness (%)"]) for r in rows})
    return ("; ".join(cells) + " (5 rounds, 125 images per node at N = 32); completeness "
            + " / ".join(f"{c:g}" for c in comp) + " %")


def _cost_cell(root: Path) -> str:
    rows = _table(root, "cost-reduced", "table_cost")
    off, on = _one(rows, transport="mixnet off"), _one(rows, transport="mixnet on")
    base = _one(rows, transport="baseline (non-anonymous DFL)")
    cpu, rnd = "CPU s/node/round", "round duration s (train + virtual network + aggregate)"
    return (f"{off[cpu]} -> {on[cpu]} s (x{float(on[cpu]) / float(off[cpu]):.1f}); {off[rnd]} -> {on[rnd]} s "
            f"(virtual network {off['virtual network s']} -> {on['virtual network s']} s); "
            f"{off['MB sent/node/round']} -> {on['MB sent/node/round']} MB (baseline {base['MB sent/node/round']} MB)")


def _tradeoff_cell(root: Path) -> str:
    rows = _table(root, "cost-reduced", "table_tradeoff")
    k = {h: _one(rows, config=f"K={h}, O=100, mu=0.1") for h in (1, 2, 3)}
    mu = {m: _one(rows, config=f"K=2, O=100, mu={m}") for m in ("0.05", "0.1", "0.2")}
    o = {x: _one(rows, config=f"K=2, O={x}, mu=0.1") for x in (10, 50, 100)}
    rss = [float(r["peak RSS (MiB, all N nodes)"]) for r in rows]
    j = "/".join
    return (f"H_path {j(k[h]['H_path (bits)'] for h in k)} bits, H_relay^loc {j(k[h]['H_relay^loc (bits)'] for h in k)}"
            f" bits, RTT {j(k[h]['RTT mean (s)'] for h in k)} s, {k[3]['MB/node']} MB/node at K = 3; mu 0.05/0.1/0.2: "
            f"RTT {j(mu[m]['RTT mean (s)'] for m in mu)} s; O = 10/50/100: H_relay {j(o[x]['H_relay (bits)'] for x in o)} "
            f"bits, {j(o[x]['MB/node'] for x in o)} MB/node; peak RSS {min(rss):.0f}-{max(rss):.0f} MiB for all 16 nodes")


def _payload_cells(root: Path, folder: str = "payload-reduced") -> tuple[str, str, str]:
    rows = _table(root, folder, "table_payload")
    frag = " / ".join(f"{_one(rows, model=m, encoding='32-bit')['fragments']} -> "
                      f"{_one(rows, model=m, encoding='8-bit')['fragments']}" for m in ("lenet5", "squeezenet", "mobilenetv2"))
    pk = "meaningful_packets_per_node_round"
    packets = f"{_one(rows, model='lenet5', encoding='32-bit')[pk]} -> {_one(rows, model='lenet5', encoding='8-bit')[pk]}"
    return frag, packets, _payload_accuracy(root, folder)


def _payload_accuracy(root: Path, folder: str) -> str:
    acc = _table(root, folder, "table_payload_accuracy")
    a8, a32 = (_one(acc, encoding=e)["final acc (%)"] for e in ("8-bit + zlib", "32-bit + zlib"))
    return f"{a8} vs {a32} % ({_pp(a8, a32)})"


def _partial_cell(root: Path, folder: str = "partial-reduced") -> str:
    rows = _table(root, folder, "table_partial")
    order = [_one(rows, r=r) for r in ("0.1", "0.25", "0.5", "1.0")]
    return (" / ".join(r["final acc (%)"] for r in order) + " % (coverage "
            + " / ".join(f"{float(r['coverage (%)']):.0f}" for r in order) + " %)")


def _churn_cell(root: Path) -> str:
    order = [_one(_table(root, "churn-reduced", "table_churn"), **{"leave prob./round": c}) for c in ("0.0", "0.1", "0.25")]
    j = lambda key, fmt="{}": " / ".join(fmt.format(r[key]) for r in order)
    return (f"accuracy {j('final acc (%)')} %, completeness {j('completeness (%)')} %, coverage {j('coverage (%)')} %, "
            f"mean live nodes {j('mean live nodes')}")


def _byzantine_cell(root: Path) -> str:
    rows = _table(root, "byzantine-reduced", "table_byzantine")
    cell = {(r["Byzantine fraction"], r["attack"], r["aggregator"]): r for r in rows}
    acc = lambda f, a, g: cell[(f, a, g)]["final acc (%)"]
    fallback = sorted({int(r["fallback ranges"]) for r in rows if r["aggregator"] == "FragKrum"})
    return (f"FragFedAvg: {acc('0.0', '-', 'FragFedAvg')} % clean -> {acc('0.2', 'arbitrary', 'FragFedAvg')} % "
            f"(arbitrary) / {acc('0.2', 'scaled', 'FragFedAvg')} % (scaled); FragKrum: {acc('0.0', '-', 'FragKrum')} % "
            f"clean, {acc('0.2', 'arbitrary', 'FragKrum')} / {acc('0.2', 'scaled', 'FragKrum')} % under the two attacks "
            f"(honest nodes), {'/'.join(map(str, fallback))} fallback ranges (n_r = 20 > 10)")


def _content_cells(root: Path) -> tuple[str, str]:
    rows = _table(root, "content-reduced", "table_content_linking")
    at = {(r["alpha"], r["r"]): r for r in rows}
    full = [at[(a, "1.0")] for a in ("0.1", "1.0", "10.0")]
    one = at[("0.1", "0.1")]
    return (" / ".join(r["identity linking"] for r in full) + " (bucket tracking "
            + " / ".join(r["bucket tracking"] for r in full) + ")",
            f"identity {one['identity linking']} ({one['fragments scored']} fragments scored)")


def _linking_cell(root: Path) -> str:
    v = linking_values(root)
    return (f"mixnet off: {v['off.acc']} vs 1/U_T {v['off.base']} (advantage {v['off.adv']}; aware {v['off.aware_acc']} "
            f"vs {v['off.aware_base']}), C_T = sender; K = 2: {v['k2.acc']} vs {v['k2.base']} (aware {v['k2.aware_acc']} "
            f"vs {v['k2.aware_base']}); K = 3: {v['k3.acc']} vs {v['k3.base']} (aware {v['k3.aware_acc']} vs "
            f"{v['k3.aware_base']}); O barely matters: the 1-hop share 1/K of paths exposes the sender on the delivering link")


def reduced_table(root: Path) -> str:
    """docs/unlinkable_dfl.md's results table: every row from the kept reduced-scale tables; the paper's column
    quotes the seed paper."""
    frag, packets, acc8 = _payload_cells(root)
    identity, low_share = _content_cells(root)
    rows = [
        ("1", "final accuracy vs N, mixnet on / off / baseline", _scaling_cell(root),
         "0.959 (small N) -> 0.729 (N = 100); completeness 100 %; on and off close"),
        ("2", "N = 32, mixnet off -> on (O = 100, 2 rounds): CPU s/node/round; round duration; MB sent/node/round",
         _cost_cell(root), "6.6 -> 14.2 s (x2.2); 6.3 -> 40.5 s; ~12 -> 60 MB"),
        ("2", "trade-off (N = 16, network only): K = 1/2/3 at O = 100", _tradeoff_cell(root),
         "Table IV: entropy up with K and O; latency dominated by delay and forwarding"),
        ("3", "fragments per update 32 -> 8 bit (LeNet-5 / SqueezeNet / MobileNetV2)", frag, "LeNet-5 26 -> 7"),
        ("3", "meaningful packets per node and round (data + acks, degree 4)", packets, "~204 -> 54"),
        ("3", "accuracy 8-bit vs 32-bit (N = 16, mixnet off)", acc8, "within 0.16 pp"),
        ("4", "accuracy at r = 0.1 / 0.25 / 0.5 / 1 (N = 16, 5 rounds)", _partial_cell(root),
         "91.00 % at r = 0.1 vs 92.94 % at r = 1"),
        ("5", "churn, leave prob. 0 / 0.1 / 0.25 per round (join 0.5)", _churn_cell(root), "converges under churn"),
        ("6", "N = 20 full mesh, 20 % Byzantine, B_r = 4", _byzantine_cell(root), "FragKrum robust, FragFedAvg not"),
        ("7", "sender identification, N = 16, 3 seeds (topology-agnostic; topology-aware)", _linking_cell(root),
         "unlinkability grows with K and O"),
        ("8", "content linking (N = 8, 4 senders, chance 0.25, 4 rounds): identity linking at r = 1 for alpha = "
              "0.1 / 1 / 10", identity, "0.95-0.99 for alpha <= 1, ~0.44 at alpha = 10"),
        ("8", "alpha = 0.1, r = 0.1", low_share, "0.52"),
    ]
    lines = ["| # | measure | ours (reduced) | paper |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| {' | '.join(r)} |" for r in rows])


def topology_table(root: Path) -> str:
    """The graph-degree supplement: accuracy and linking per degree, from the kept topology experiment."""
    acc = _table(root, "topology-reduced", "table_topology_accuracy")
    link = {r["degree"]: r for r in _table(root, "topology-reduced", "table_topology_linking")}
    lines = ["| degree | final accuracy | MB sent / node / round | linking advantage agnostic (bound) | "
             "aware accuracy vs 1/\\|U_T\\| | aware advantage (bound) |", "|---|---|---|---|---|---|"]
    for r in acc:
        label = f"{r['degree']} (full mesh)" if r["topology"] == "full-mesh" else r["degree"]
        t = link.get(r["degree"]) if r["topology"] != "full-mesh" else None
        tail = ("| | |" if t is None else
                f"{t['agnostic: advantage']} ({t['agnostic: chain bound (ours), trace']}) | {t['aware: accuracy']} vs "
                f"{t['aware: 1/#U_T']} | {t['aware: advantage']} ({t['aware: chain bound (ours), trace']}) |")
        lines.append(f"| {label} | {r['final acc (%)']} % | {r['MB sent / node / round']} | {tail}")
    return "\n".join(lines)


def datasets_table(root: Path) -> str:
    """The ``--dataset`` table: Fashion-MNIST beside the MNIST subset, both kept, and the paper."""
    fashion = "fashion-mnist"
    _, _, acc8_f = _payload_cells(root, f"payload-reduced-{fashion}")
    pay = _table(root, f"payload-reduced-{fashion}", "table_payload_accuracy")
    pk = " vs ".join(_one(pay, encoding=e)["meaningful packets/node/round"].removesuffix(".0")
                     for e in ("8-bit + zlib", "32-bit + zlib"))
    mb = " vs ".join(_one(pay, encoding=e)["MB sent/node/round"] for e in ("8-bit + zlib", "32-bit + zlib"))
    lines = ["| experiment | Fashion-MNIST (ours, reduced) | MNIST subset (ours, reduced) | paper (full MNIST) |",
             "|---|---|---|---|",
             f"| payload: 8-bit vs 32-bit, mixnet off | {acc8_f}; {pk} packets, {mb} MB per node and round | "
             f"{_payload_accuracy(root, 'payload-reduced')} | within 0.16 pp |",
             f"| partial: accuracy at r = 0.1 / 0.25 / 0.5 / 1 (mixnet on; coverage) | "
             f"{_partial_cell(root, f'partial-reduced-{fashion}')} | {_partial_cell(root)} | "
             "91.00 % at r = 0.1 vs 92.94 % at r = 1 |"]
    return "\n".join(lines)


BLOCKS.update({"udfl-reduced-table": reduced_table, "udfl-topology-table": topology_table,
               "udfl-datasets-table": datasets_table})


def topology_values(root: Path) -> Mapping[str, str]:
    """What the graph-degree prose quotes, from the same kept tables."""
    acc = {r["degree"]: r for r in _table(root, "topology-reduced", "table_topology_accuracy")}
    link = {r["degree"]: r for r in _table(root, "topology-reduced", "table_topology_linking")}
    adv = [float(r["agnostic: advantage"]) for r in link.values()]
    return {"gain_2_to_8": f"{float(acc['8']['final acc (%)']) - float(acc['2']['final acc (%)']):+.1f} pp",
            "agnostic_adv": f"{min(adv):.2f}-{max(adv):.2f}",
            "aware_acc_2": f"{100 * float(link['2']['aware: accuracy']):.0f} %",
            "aware_adv_2": f"{float(link['2']['aware: advantage']):.2f}",
            **_rerun_values(root, "topology")}


def _rerun_values(root: Path, experiment: str) -> dict[str, str]:
    """Wall time and load of an experiment's kept rerun (``rerun_notes.json`` beside the tables)."""
    notes = read_json(root / REDUCED / "rerun_notes.json")
    if experiment not in notes["experiments"]:
        raise KeyError(f"rerun_notes.json has no wall time for {experiment!r}")
    e = notes["experiments"][experiment]
    return {"wall_min": f"{e['wall_seconds'] / 60:.1f}", "load": e["load"]}


VALUES.update({"udfl-topology": topology_values})


def rerun_values(root: Path) -> Mapping[str, str]:
    """Minutes each kept reduced experiment took in its rerun."""
    notes = read_json(root / REDUCED / "rerun_notes.json")
    return {name: f"{e['wall_seconds'] / 60:.1f}" for name, e in notes["experiments"].items()}


VALUES.update({"udfl-rerun": rerun_values})


CARD_LEARNING = "mnist-5k lenet5, T=5, q8, share 1, fedavg, alpha 10"  # the scaling runs' learning part
CARD_GRAPH = "circulant d=4, 7 fragments/peer"
CARD_COLUMNS = ("condition", "seeds", "test accuracy (%)", "linking advantage", "H_relay (bits)", "H_path (bits)",
                "H_relay^loc (bits)")


def card_table(root: Path) -> str:
    """The report card's rows of the scaling runs and of the N = 16 linking grid (flower_apps.unlinkable_dfl.card
    over the kept folder): learning and linking in one row where they share a transport."""
    from flower_apps.common.report_card import build_card
    from flower_apps.unlinkable_dfl.card import CARD

    rows = build_card(CARD, CARD.collect(root / REDUCED))

    def wanted(r: dict) -> bool:
        c = str(r["condition"])
        if c.startswith("linking only:"):
            return c.endswith(f"; N=16, {CARD_GRAPH}")
        return not c.startswith("learning only:") and c.endswith(f"{CARD_GRAPH} | {CARD_LEARNING}")

    picked = [r for r in rows if wanted(r)]
    if not picked:
        raise FileNotFoundError(f"no kept scaling or linking rows under {REDUCED}")
    head = ["configuration \\| learning" if c == "condition" else c for c in CARD_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in picked:
        cond = str(r["condition"]).replace(f", {CARD_GRAPH} | {CARD_LEARNING}", "").replace(f", {CARD_GRAPH}", "")
        lines.append("| " + " | ".join([cond] + [str(r[c]) for c in CARD_COLUMNS[1:]]) + " |")
    return "\n".join(lines)


BLOCKS.update({"udfl-card-table": card_table})


def card_values(root: Path) -> Mapping[str, str]:
    """The ranges the card's prose quotes: linking advantage without the mixnet, at K = 2 (O = 20), K = 1 and K = 3."""
    table = card_table(root).splitlines()[2:]
    adv: dict[str, list[float]] = {"off": [], "k2o20": [], "k1": [], "k3": []}
    for line in table:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        value = float(cells[3].split()[0])
        cond = cells[0]
        key = ("off" if "mixnet off" in cond else "k2o20" if "K=2, O=20," in cond else
               "k1" if "K=1," in cond else "k3" if "K=3," in cond else "")
        if key:
            adv[key].append(value)
    if not all(adv.values()):
        raise ValueError(f"the card lacks rows for {[k for k, v in adv.items() if not v]}")
    return {k: f"{min(v):.2f}-{max(v):.2f}" for k, v in adv.items()}


VALUES.update({"udfl-card": card_values})


NETLEARN = REDUCED / "netlearn" / "N8_T5_s0.json"  # python -m flower_apps.unlinkable_dfl.netlearn --results-dir results_reduced


def netlearn_table(root: Path) -> str:
    """The same Flower run with fragments carried by the simulator and by 8 node processes over TLS (kept JSON)."""
    r = read_json(root / NETLEARN)
    lines = ["| carrier | accuracy per round | completeness | network phase per round (mean) | MB sent / node / round "
             "| run wall time |", "|---|---|---|---|---|---|"]
    for carrier, name, clock in (("simulation", "simulator", "virtual"), ("network", "8 processes over TLS", "real")):
        curve = " / ".join(f"{100 * a:.1f}" for a in r[f"{carrier}_acc_curve"])
        lines.append(f"| {name} | {curve} % | {100 * r[f'{carrier}_mean_completeness']:.0f} % | "
                     f"{r[f'{carrier}_mean_network_virtual_s']:.2f} s {clock} | "
                     f"{r[f'{carrier}_mean_bytes_per_node'] / 1e6:.2f} | {r[f'{carrier}_wall_seconds']:.0f} s |")
    return "\n".join(lines)


def netlearn_values(root: Path) -> Mapping[str, str]:
    r = read_json(root / NETLEARN)
    extra = r["network_mean_bytes_per_node"] / r["simulation_mean_bytes_per_node"] - 1
    return {"extra_bytes": f"{100 * extra:.0f} %", "accuracy_difference": f"{r['accuracy_difference']:.4f}",
            **_rerun_values(root, "netlearn")}


BLOCKS.update({"udfl-netlearn-table": netlearn_table})
VALUES.update({"udfl-netlearn": netlearn_values})
del VALUES["udfl-linking"]  # row 7 of udfl-reduced-table renders those values now


def linking_paper_values(root: Path) -> Mapping[str, str]:
    """The paper-scale (N = 32) linking numbers the theory prose quotes: one seed of ``--experiment linking
    --scale paper`` (kept transport measurements)."""
    from dataclasses import asdict

    from flower_apps.unlinkable_dfl.sweep import TrafficSpec, plan, traffic_path

    specs = [TrafficSpec(**{**asdict(s), "seed": 0}) for s in plan("linking", "paper").traffic]
    paths = [traffic_path(str(root / REDUCED.parent), s) for s in specs]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} paper-scale linking measurements are not kept, e.g. {missing[0]}")
    runs = {(r["max_hops"], r["outbox"]): r for r in (read_json(p)["result"] for p in paths) if r["mixnet"]}
    out = {"configs": str(len(paths))}
    for (k, o), r in runs.items():
        tag = f"k{k}o{o}"
        out[f"{tag}.h_trace"] = f"{r['relay_h_inf_bits']:.2f}"
        out[f"{tag}.h_aware"] = f"{r['aware_relay_h_inf_bits']:.2f}"
        for field, name in (("advantage", "adv"), ("trace_bound", "chain"), ("trace_bound_c0.25", "chain_c"),
                            ("ideal_bound", "ideal")):
            out[f"{tag}.{name}"] = " / ".join(f"{r[f'{a}_{field}']:.3f}" for a in ADVERSARIES)
        out[f"{tag}.aware_adv"] = f"{r['aware_advantage']:.3f}"
        out[f"{tag}.aware_ideal"] = f"{r['aware_ideal_bound']:.3f}"
    out.update({f"wall_{k}": v for k, v in _rerun_values(root, "linking-paper").items()})
    return out


VALUES.update({"udfl-linking-paper": linking_paper_values})


MIXNET_SCALE = Path("results_bench") / "mixnet_scale.json"  # python benchmarks/mixnet_scale.py --json ...


def mixnet_scale_table(root: Path) -> str:
    """The simulator's cost against N (issue 40): CPU and wall seconds per node-round, peak RSS, fitted growth."""
    import re

    data = read_json(root / MIXNET_SCALE)
    per: dict[int, dict[str, str]] = {}
    growth = ""
    for r in data["rows"]:
        m = re.match(r"mixnet N=(\d+): (process CPU s per node-round \(wall ([\d.]+); (\d+) undelivered\)|peak RSS MiB)",
                     r["metric"])
        if m:
            cell = per.setdefault(int(m.group(1)), {})
            if m.group(3) is not None:
                cell.update(cpu=f"{r['value']:.4f}", wall=m.group(3), undelivered=m.group(4))
            else:
                cell["rss"] = f"{r['value']:.0f}"
        elif r["metric"].startswith("mixnet: growth exponent"):
            growth = f"{r['value']:.2f}"
    if not per or not growth:
        raise ValueError(f"{MIXNET_SCALE} lacks the per-N rows or the growth exponent")
    lines = ["| N | process CPU s per node-round | wall s per node-round | peak RSS (MiB) | undelivered |",
             "|---|---|---|---|---|"]
    lines += [f"| {n} | {c['cpu']} | {c['wall']} | {c['rss']} | {c['undelivered']} |" for n, c in sorted(per.items())]
    run = data["run"]
    lines.append(f"\nFitted growth of CPU seconds per round in N: exponent {growth} (1 = linear); measured "
                 f"{run['date']}, {run['cpus']} cores, load average {run['load_average_start']} at the start.")
    return "\n".join(lines)


BLOCKS["udfl-mixnet-scale-table"] = mixnet_scale_table
