"""The dfl-dp parts of README.md that are generated from kept run folders (``python -m flower_apps.report --check``).

Data: ``results_protocol/dfl-dp/runs/*/summary.json`` and ``rounds.jsonl`` (the 24-run protocol grid on
Fashion-MNIST), ``paper_table3.json`` (the paper's cells we compare to, with their source) and
``wall_notes.json`` (under which load each run's wall time was taken). See
:mod:`flower_apps.common.doc_blocks`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flower_apps.common.results import read_json, read_jsonl
from flower_apps.common.stats import summarize
from flower_apps.dfl_dp.metrics import retention_and_degradation
from flower_apps.dfl_dp.report import FW_LABEL, condition_of

PROTOCOL = Path("results_protocol") / "dfl-dp"
FRAMEWORKS = ("fl", "sequential-dfl")
CONDITIONS = ("No-DP", "C=1, eps_cal=1", "C=1, eps_cal=2", "C=1, eps_cal=4")
SHORT = {"No-DP": "nodp", "C=1, eps_cal=1": "eps1", "C=1, eps_cal=2": "eps2", "C=1, eps_cal=4": "eps4"}


def protocol_runs(root: Path) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(framework, condition) -> the cell's finished runs, by seed; each summary gets its ``rounds``."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    paths = sorted((root / PROTOCOL / "runs").glob("*/summary.json"))
    if not paths:
        raise FileNotFoundError(f"no kept runs under {PROTOCOL}/runs")
    for path in paths:
        s = dict(read_json(path))
        s["rounds"] = read_jsonl(path.parent / "rounds.jsonl")
        out.setdefault((s["framework"], condition_of(s)), []).append(s)
    for runs in out.values():
        runs.sort(key=lambda s: s["seed"])
    missing = [(fw, c) for fw in FRAMEWORKS for c in CONDITIONS if (fw, c) not in out]
    if missing:
        raise ValueError(f"protocol grid cells without runs: {missing}")
    return out


def _per_seed(values: list[float], fmt: Callable[[float], str], mean: bool = True) -> str:
    text = " / ".join(fmt(v) for v in values)
    return f"{text} ({fmt(statistics.fmean(values))})" if mean else text


def _pct(v: float) -> str:
    return f"{v:.2f}"


def _retentions(cells: dict[tuple[str, str], list[dict[str, Any]]], fw: str, cond: str) -> list[float]:
    base = {s["seed"]: s["final_acc"] for s in cells[(fw, "No-DP")]}
    return [retention_and_degradation(s["final_acc"], base[s["seed"]])[0] for s in cells[(fw, cond)]]


def _eps_text(s: dict[str, Any]) -> str:
    if not s["dp"]:
        return "inf"
    acc = s["accounting"]
    if acc["eps_gdp_exact"] is None:
        return f"{acc['eps_total']:.2g} (> 500 exact GDP)".replace("e+0", "e")
    return f"{acc['eps_total']:.4g} (RDP)"


def protocol_table(root: Path) -> str:
    """README's protocol-grid table: each cell seed 0 / 1 / 2 (mean), the paper's printed cell beside it."""
    cells = protocol_runs(root)
    paper = read_json(root / PROTOCOL / "paper_table3.json")
    notes = read_json(root / PROTOCOL / "wall_notes.json")["notes"]
    head = ["framework", "condition", "final acc (%)", "best acc (%)", "rounds to 75%", "clipping frequency",
            "retention vs No-DP", "paper: final acc (%)", "paper's accuracies: retention (ours)", "eps_total", "wall"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for fw in FRAMEWORKS:
        paper_fw = paper["final_acc_pct"].get(fw, {})
        for cond in CONDITIONS:
            runs = cells[(fw, cond)]
            final = _per_seed([100 * s["final_acc"] for s in runs], _pct)
            best = _per_seed([100 * s["best_acc"] for s in runs], _pct, mean=False)
            r75 = [s["rounds_to_75"] for s in runs]
            rounds = "not reached" if all(r is None for r in r75) else " / ".join(
                "not reached" if r is None else str(r) for r in r75)
            if runs[0]["dp"]:
                clip = " / ".join(f"{s['clip_frequency_pct']:.1f}" for s in runs) + f"% of {runs[0]['clip_unit']}"
                ret = _per_seed(_retentions(cells, fw, cond), lambda v: f"{v:.1f}") + "%"
            else:
                clip = ret = "-"
            if cond in paper_fw:
                paper_acc = f"{paper_fw[cond]:.2f}"
            else:
                paper_acc = "printed, value not here" if cond in paper["printed_conditions"] else "not printed"
            paper_ret = "-"
            if cond != "No-DP" and cond in paper_fw and "No-DP" in paper_fw:
                paper_ret = f"{retention_and_degradation(paper_fw[cond], paper_fw['No-DP'])[0]:.1f}%"
            wall = " / ".join(f"{s['wall_seconds']:,.0f} ({notes[s['run']]})" for s in runs) + " s"
            lines.append("| " + " | ".join([FW_LABEL.get(fw, fw), cond.replace("C=1", "C = 1").replace(
                "eps_cal=", "eps_cal = "), final, best, rounds, clip, ret, paper_acc, paper_ret,
                _eps_text(runs[0]), wall]) + " |")
    return "\n".join(lines)


def cnn_parameters() -> int:
    """Parameters of the study's CNN on 28 x 28 grey images (the dimension sigma_abs is drawn in)."""
    from models.small_cnn import build_small_cnn

    return sum(p.numel() for p in build_small_cnn(0).parameters())


def protocol_values(root: Path) -> Mapping[str, str]:
    """Values the README's prose about the protocol grid quotes: ``<fw>.<cond>.<what>``.

    ``what``: ``final`` / ``best`` (per seed, %), ``final_mean``, ``rounds75`` (per seed),
    ``ret`` (per seed, %), ``ret_mean``, ``ret_ci`` (95% t-interval over seeds), ``clip`` (per seed, %),
    ``eps`` (eps_total), ``sigma`` (sigma_abs per coordinate), ``norm0`` (seed 0's mean client-update
    norm over its rounds), ``median_norm_11_100`` (per seed: the median round-update norm over rounds 11-100),
    ``gap`` (DFL minus FL mean final accuracy, points).
    """
    cells = protocol_runs(root)
    params = cnn_parameters()
    out: dict[str, str] = {}
    for (fw, cond), runs in cells.items():
        if cond not in SHORT:
            continue
        k = f"{fw}.{SHORT[cond]}"
        finals = [100 * s["final_acc"] for s in runs]
        out[f"{k}.final"] = " / ".join(_pct(v) for v in finals)
        out[f"{k}.final_mean"] = f"{statistics.fmean(finals):.2f}"
        out[f"{k}.final_mean1"] = f"{statistics.fmean(finals):.1f}"
        out[f"{k}.best"] = " / ".join(f"{100 * s['best_acc']:.1f}" for s in runs)
        out[f"{k}.final_s0"] = f"{finals[0]:.1f}"
        out[f"{k}.best_s0"] = f"{100 * runs[0]['best_acc']:.1f}"
        out[f"{k}.rounds75"] = " / ".join("never" if s["rounds_to_75"] is None else str(s["rounds_to_75"])
                                          for s in runs)
        if runs[0]["dp"]:
            rets = _retentions(cells, fw, cond)
            summ = summarize(rets)
            out[f"{k}.norm0"] = f"{statistics.fmean(r['update_norm_mean'] for r in runs[0]['rounds']):.2f}"
            out[f"{k}.ret"] = " / ".join(f"{v:.1f}" for v in rets)
            out[f"{k}.ret_mean"] = f"{summ.mean:.1f}"
            out[f"{k}.ret_ci"] = f"[{summ.ci_low:.1f}, {summ.ci_high:.1f}]"
            out[f"{k}.clip"] = " / ".join(f"{s['clip_frequency_pct']:.0f}" for s in runs)
            out[f"{k}.clip1_s0"] = f"{runs[0]['clip_frequency_pct']:.1f}"
            sigma = runs[0]["accounting"]["sigma_abs"]
            out[f"{k}.noise_norm"] = f"{sigma * math.sqrt(params):.1f}"
            out[f"{k}.eps"] = f"{runs[0]['accounting']['eps_total']:.1f}"
            out[f"{k}.sigma"] = f"{runs[0]['accounting']['sigma_abs']:.4f}"
            out[f"{k}.median_norm_11_100"] = " / ".join(
                f"{statistics.median(r['update_norm_mean'] for r in s['rounds'] if r['round'] > 10):.3f}"
                for s in runs)
    r75 = [s["rounds_to_75"] for cond in CONDITIONS for s in cells[("sequential-dfl", cond)]]
    out["sequential-dfl.rounds75_range"] = f"{min(r75)}-{max(r75)}" if None not in r75 else "not always reached"
    eps = [s["accounting"]["eps_total"] for cond in CONDITIONS[1:] for s in cells[("sequential-dfl", cond)]]
    out["sequential-dfl.eps_range"] = f"{min(eps):.1e}-{max(eps):.1e}".replace("e+0", "e")
    out["params"] = f"{params:,}"
    paper = read_json(root / PROTOCOL / "paper_table3.json")["final_acc_pct"]
    for fw, cells_fw in paper.items():  # our ratio of two accuracies the paper prints (it prints no retention)
        for cond, acc in cells_fw.items():
            if cond != "No-DP" and "No-DP" in cells_fw:
                out[f"paper.{fw}.{SHORT[cond]}.ret"] = f"{retention_and_degradation(acc, cells_fw['No-DP'])[0]:.1f}"
    for cond in CONDITIONS:
        c = SHORT[cond]
        out[f"gap.{c}"] = f"{float(out[f'sequential-dfl.{c}.final_mean']) - float(out[f'fl.{c}.final_mean']):.1f}"
    return out


BLOCKS = {"dfl-dp-protocol-table": protocol_table}
VALUES = {"dfl-dp-protocol": protocol_values}
