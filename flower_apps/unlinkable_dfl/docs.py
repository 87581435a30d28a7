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
