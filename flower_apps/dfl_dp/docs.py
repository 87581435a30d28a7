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
REDUCED = Path("results_reduced") / "dfl-dp"
PAPER = Path("results_paper") / "dfl-dp" / "paper_table3.json"
# --grid demo --attacks --attack-eps-cal 2, then the same with --audit, into one results folder (2026-12-07)
ATTACKS = Path("results_reduced") / "dfl-dp-attacks"
FRAMEWORKS = ("fl", "sequential-dfl")
CONDITIONS = ("No-DP", "C=1, eps_cal=1", "C=1, eps_cal=2", "C=1, eps_cal=4")
SHORT = {"No-DP": "nodp", "C=1, eps_cal=1": "eps1", "C=1, eps_cal=2": "eps2", "C=1, eps_cal=4": "eps4"}


def protocol_runs(root: Path, folder: Path = PROTOCOL,
                  conditions: tuple[str, ...] = CONDITIONS) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(framework, condition) -> the cell's finished runs, by seed; each summary gets its ``rounds``."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    paths = sorted((root / folder / "runs").glob("*/summary.json"))
    if not paths:
        raise FileNotFoundError(f"no kept runs under {folder}/runs")
    for path in paths:
        s = dict(read_json(path))
        s["rounds"] = read_jsonl(path.parent / "rounds.jsonl")
        out.setdefault((s["framework"], condition_of(s)), []).append(s)
    for runs in out.values():
        runs.sort(key=lambda s: s["seed"])
    missing = [(fw, c) for fw in FRAMEWORKS for c in conditions if (fw, c) not in out]
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
    paper = read_json(root / PAPER)
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
            # seed 0's mean client-update norm over the norm of the round's noise vector
            snr0 = statistics.fmean(r["update_norm_mean"] for r in runs[0]["rounds"]) / (sigma * math.sqrt(params))
            out[f"{k}.snr0"] = f"{snr0:.2f}"
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
    every = [s for runs in cells.values() for s in runs]  # wall time of the kept grid, ServerApp start to end
    per_round = [s["wall_seconds"] / len(s["rounds"]) for s in every]
    out["wall.total_h"] = f"{sum(s['wall_seconds'] for s in every) / 3600:.1f}"
    out["wall.runs"] = str(len(every))
    out["wall.per_round"] = f"{min(per_round):.0f}-{max(per_round):.0f}"
    paper = read_json(root / PAPER)["final_acc_pct"]
    for fw, cells_fw in paper.items():  # our ratio of two accuracies the paper prints (it prints no retention)
        for cond, acc in cells_fw.items():
            if cond != "No-DP" and "No-DP" in cells_fw:
                out[f"paper.{fw}.{SHORT[cond]}.ret"] = f"{retention_and_degradation(acc, cells_fw['No-DP'])[0]:.1f}"
    for cond in CONDITIONS:
        c = SHORT[cond]
        out[f"gap.{c}"] = f"{float(out[f'sequential-dfl.{c}.final_mean']) - float(out[f'fl.{c}.final_mean']):.1f}"
    return out


REDUCED_CONDITIONS = ("No-DP", "C=1, eps_cal=2", "C=1, eps_cal=4", "C=0.1, eps_cal=2", "C=0.1, eps_cal=4")


def reduced_table(root: Path) -> str:
    """README's reduced-grid table: final accuracy mean +- SD over the kept seeds beside the paper's (T = 100)."""
    cells = protocol_runs(root, REDUCED, REDUCED_CONDITIONS)
    paper = read_json(root / PAPER)
    seeds = sorted({s["seed"] for runs in cells.values() for s in runs})
    head = ["", "FL (ours, T=20)", "FL (paper, T=100)", "Seq. DFL (ours, T=20)", "Seq. DFL (paper, T=100)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ours(fw: str, cond: str) -> str:
        vals = [100 * s["final_acc"] for s in cells[(fw, cond)]]
        sd = statistics.stdev(vals) if len(vals) > 1 else math.nan
        return f"{statistics.fmean(vals):.2f} +- {sd:.2f}"

    def theirs(fw: str, cond: str) -> str:
        if cond not in paper["final_acc_pct"][fw]:
            return "printed, value not here" if cond in paper["printed_conditions"] else "not printed"
        return f"{paper['final_acc_pct'][fw][cond]:.2f} +- {paper['final_acc_sd_pct'][fw][cond]:.2f}"

    for cond in REDUCED_CONDITIONS:
        lines.append(f"| {cond} | {ours('fl', cond)} | {theirs('fl', cond)} | {ours('sequential-dfl', cond)} | "
                     f"{theirs('sequential-dfl', cond)} |")
    quoted = paper["quoted_elsewhere"]

    def r75(fw: str) -> str:
        vals = [s["rounds_to_75"] for s in cells[(fw, "No-DP")]]
        return "not reached" if all(v is None for v in vals) else " / ".join(
            "not reached" if v is None else str(v) for v in vals)

    def clip(fw: str) -> str:
        vals = [s["clip_frequency_pct"] for cond in REDUCED_CONDITIONS if cond.startswith("C=0.1")
                for s in cells[(fw, cond)]]
        lo, hi = f"{min(vals):.0f}", f"{max(vals):.0f}"
        return f"{lo if lo == hi else lo + '-' + hi}% of {cells[(fw, 'C=0.1, eps_cal=2')][0]['clip_unit']}"

    lines.append(f"| rounds to 75% (No-DP, per seed) | {r75('fl')} | {quoted['rounds_to_75_nodp']['fl']} (quoted) | "
                 f"{r75('sequential-dfl')} | {quoted['rounds_to_75_nodp']['sequential-dfl']} (quoted) |")
    lines.append(f"| clipping at C=0.1 | {clip('fl')} | {quoted['clip_frequency_C0.1']['fl']} (quoted) | "
                 f"{clip('sequential-dfl')} | {quoted['clip_frequency_C0.1']['sequential-dfl']} (quoted) |")
    lines.append("")
    lines.append(f"Seeds {', '.join(map(str, seeds))}; `results_reduced/dfl-dp/runs/` (kept).")
    return "\n".join(lines)


def reduced_values(root: Path) -> Mapping[str, str]:
    """Values the README's prose about the reduced grid quotes (see :func:`protocol_values` for the keys)."""
    cells = protocol_runs(root, REDUCED, REDUCED_CONDITIONS)
    out: dict[str, str] = {}
    any_run = next(iter(cells.values()))[0]
    out["n_target_train"] = f"{any_run['n_target_train']:,}"
    out["per_client"] = f"{any_run['n_target_train'] / any_run['num_clients']:.0f}"
    for (fw, cond), runs in cells.items():
        k = f"{fw}.{cond.replace('C=', 'C').replace(', eps_cal=', '_eps').replace('No-DP', 'nodp')}"
        if runs[0]["dp"]:
            out[f"{k}.eps"] = f"{runs[0]['accounting']['eps_total']:.3g}"
            norms = [r["update_norm_mean"] for s in runs for r in s["rounds"]]
            out[f"{k}.norm_mean"] = f"{statistics.fmean(norms):.2g}"
    base = statistics.fmean(s["final_acc"] for s in cells[("sequential-dfl", "No-DP")])
    rets = [100 * statistics.fmean(s["final_acc"] for s in runs) / base for (fw, cond), runs in cells.items()
            if fw == "sequential-dfl" and cond != "No-DP"]
    out["sequential-dfl.ret_range"] = f"{math.floor(min(rets))}-{math.floor(max(rets))}"
    out["fl.nodp.final_mean0"] = f"{statistics.fmean(100 * s['final_acc'] for s in cells[('fl', 'No-DP')]):.0f}"
    out["wall_min"] = f"{sum(s['wall_seconds'] for runs in cells.values() for s in runs) / 60:.0f}"
    eps = [s["accounting"]["eps_total"] for (fw, cond), runs in cells.items() if fw == "sequential-dfl"
           and cond != "No-DP" for s in runs[:1]]
    out["sequential-dfl.eps_range"] = f"{min(eps):.0e}-{max(eps):.0e}".replace("e+0", "e")
    out["paper.fl.clip_C0.1"] = read_json(root / PAPER)["quoted_elsewhere"]["clip_frequency_C0.1"]["fl"]
    return out


def card_table(root: Path) -> str:
    """README's dfl-dp report card at the CPU scale: the card's own rows (flower_apps.dfl_dp.card) of the kept runs."""
    from flower_apps.common.report_card import build_card
    from flower_apps.common.tables import markdown_table
    from flower_apps.dfl_dp.card import CARD

    records = CARD.collect(root / ATTACKS / "dfl-dp")
    if not records:
        raise FileNotFoundError(f"no kept runs under {ATTACKS}/dfl-dp/runs")
    md = markdown_table(build_card(CARD, records), "card")
    return md.split("\n", 2)[2].rstrip("\n")  # the table without its title


def attack_values(root: Path) -> Mapping[str, str]:
    """Numbers of README's attack summary, from the kept attack rows (flower_apps.dfl_dp.attack_report)."""
    from flower_apps.dfl_dp.attack_report import load_attack_rows

    mia, inversion = load_attack_rows(root / ATTACKS)
    if not mia or "gradient" not in inversion:
        raise FileNotFoundError(f"no kept attack results under {ATTACKS}/dfl-dp/runs")
    aucs = [r["auc"] for r in mia]
    out = {"mia_auc": f"{min(aucs):.2f}-{max(aucs):.2f}", "mia_rows": str(len(mia)),
           "members": str(mia[0]["n_target_members"]), "nonmembers": str(mia[0]["n_target_nonmembers"])}
    grad = inversion["gradient"]
    for fw in FRAMEWORKS:
        for cond in ("nodp", "C1_eps2"):
            for attack in ("invgrad", "dlg", "idlg"):
                picked = [r["ssim"] for r in grad if r["framework"] == fw and r["condition"] == cond
                          and r["attack"] == attack]
                if picked:
                    out[f"ssim.{fw}.{cond}.{attack}"] = f"{statistics.fmean(picked):.2f}"
    weak = [float(out[k]) for k in out if k.startswith("ssim.") and not k.endswith("invgrad")]
    out["ssim_dlg_range"] = f"{min(weak):.2f}-{max(weak):.2f}"
    return out


BLOCKS = {"dfl-dp-protocol-table": protocol_table, "dfl-dp-reduced-table": reduced_table,
          "dfl-dp-card-table": card_table}
VALUES = {"dfl-dp-protocol": protocol_values, "dfl-dp-reduced": reduced_values, "dfl-dp-attacks": attack_values}


ROUND_BENCH = Path("results_bench") / "dfl_dp_round_full.json"  # python benchmarks/dfl_dp_round.py --json ...
ROUND_TARGETS = {"fl": 1.3, "sequential-dfl": 1.5}


def round_table(root: Path) -> str:
    """README's round benchmark: one dfl-dp round through Flower vs the plain loop, per transport setting."""
    rows = read_json(root / ROUND_BENCH)["rows"]
    lines = ["| framework | clients per message | CPUs per node | plain s/round | Flower s/round | ratio | target |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        target = ROUND_TARGETS[r["framework"]]
        ratio = f"{r['ratio']:.2f}"
        lines.append(f"| {FW_LABEL.get(r['framework'], r['framework'])} | {r['clients_per_message']} | "
                     f"{r['cpus_per_node']:g} | {r['plain_s']:.2f} | {r['flower_s']:.2f} | "
                     f"{f'**{ratio}**' if r['ratio'] <= target else ratio} | <= {target:g} |")
    return "\n".join(lines)


def round_values(root: Path) -> Mapping[str, str]:
    """The round benchmark's run (date, load, peak memory) and its hop breakdown, for README's prose."""
    data = read_json(root / ROUND_BENCH)
    run = data["run"]
    out = {"date": run["date"], "load_end": f"{run['load_average_end']:.1f}",
           "peak_gib": f"{max(data['peak_rss_mib'].values()) / 1024:.1f}"}
    hop = next((r for r in data["rows"] if "hop_ms" in r and r["cpus_per_node"] == 2), None)
    if hop is not None:
        slug = {"push->node pickup": "push", "pickup->ClientApp": "pickup", "ClientApp train()": "train",
                "reply->ServerApp": "reply", "  of which last poll gap": "poll_gap", "ServerApp turn": "turn", "hop": "hop"}
        out.update({f"hop.{slug[k]}": f"{v:.0f}" for k, v in hop["hop_ms"].items() if k in slug})
        out["hop.plain_client"] = f"{hop['plain_client_ms']:.1f}"
    return out


BLOCKS["dfl-dp-round-table"] = round_table
VALUES["dfl-dp-round"] = round_values


def sampling_eps_table(root: Path) -> str:
    """docs/client_sampling.md's orientation table: FL at N = 100, T = 20, C = 1, eps_cal = 2, per q, computed by
    privacy.accounting.account_sampled (dp-accounting), Poisson under add/remove, fixed size under replace-one."""
    from privacy.accounting import account_sampled

    lines = ["| q | sigma_abs | Poisson (add/remove): amplified / unamplified | "
             "fixed size (replace-one): amplified / unamplified |", "| --- | --- | --- | --- |"]
    for q in (1.0, 0.5, 0.2, 0.1):
        p = account_sampled("fl", 1.0, 2.0, 100, 20, fraction=q, scheme="poisson")
        f = account_sampled("fl", 1.0, 2.0, 100, 20, fraction=q, scheme="fixed")
        lines.append(f"| {q:g} | {p.sigma_abs:.4g} | {p.eps_amplified:.3g} / {p.eps_unamplified:.3g} | "
                     f"{f.eps_amplified:.3g} / {f.eps_unamplified:.3g} |")
    return "\n".join(lines)


BLOCKS["dfl-dp-sampling-eps"] = sampling_eps_table
