"""The tabular-pdp parts of docs/tabular_pdp.md generated from kept run folders (``python -m flower_apps.report --check``).

Data (rerun 2026-12-07 under the current code, model weights removed):

* ``results_reduced/tabular-pdp/``: ``python -m flower_apps.tabular_pdp.sweep`` (the reduced grid: 3 seeds x
  vanilla / GDP / PDP, 5 rounds x 10 local epochs, C estimated; 3 poison kinds x 5 detection runs);
* ``results_reduced/tabular-pdp-variants/c85/``: the same main runs with the paper's C = 8.5
  (``--clip-norm 8.5 --drift-seeds 0``);
* ``results_reduced/tabular-pdp-variants/e2/``: detection with a 2-local-epoch first round
  (``--epochs 2 --seeds 0 --drift-seeds 5``);
* ``results_reduced/tabular-pdp-audit/{n1,paper}/``: ``--grid smoke --audit --drift-seeds 0`` at
  ``--noise-multiplier 1.0`` and at the paper's 0.05;
* ``results_reduced/tabular-pdp-real/``: ``python -m flower_apps.tabular_pdp.real_table`` on the real 50,000-row
  partial file (``../shared/data/cancer``).

The numbers are computed with the study's own report functions (:mod:`flower_apps.tabular_pdp.report`).
See :mod:`flower_apps.common.doc_blocks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flower_apps.common.results import read_json
from flower_apps.common.tables import seed_cell
from flower_apps.tabular_pdp.audit_report import setting_results
from flower_apps.tabular_pdp.report import PAPER_TABLE2, PAPER_TABLE3, load_summaries
from privacy.drift import detection_rates

REDUCED = Path("results_reduced")
VARIANTS = REDUCED / "tabular-pdp-variants"
REAL = REDUCED / "tabular-pdp-real" / "real_partial_anonymization.json"
ATTACKS = REDUCED / "tabular-pdp-attacks"  # --grid reduced --attacks --drift-seeds 0, then flower_apps.report
AUDIT = REDUCED / "tabular-pdp-audit"  # smoke preset with --audit: n1/ at n_eps = 1, paper/ at the paper's 0.05
SETTINGS = ("vanilla", "gdp", "pdp")
POISONS = ("flip-targets", "scale-features", "shift-targets")


def _runs(root: Path, folder: Path) -> list[dict[str, Any]]:
    runs = load_summaries(root / folder)
    if not runs:
        raise FileNotFoundError(f"no kept tabular-pdp runs under {folder}/tabular-pdp/runs")
    return runs


def _main_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((s for s in runs if s["poison"] == "none" and s["settings"]), key=lambda s: s["seed"])


def _span(values: list[float], fmt: str = "{:,.0f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def _setting_cells(runs: list[dict[str, Any]], name: str) -> dict[str, str]:
    v = [s["settings"][name] for s in runs]
    cells = {"MAE": seed_cell([x["final_mae"] for x in v], 3), "MRE": seed_cell([x["final_mre"] for x in v], 3)}
    if name == "vanilla":
        return {**cells, "release": "inf", "server": "inf"}
    server = [a["eps_server_view_rdp"] for x in v for a in x["accounting"].values() if "eps_server_view_rdp" in a]
    return {**cells, "release": _span([x["eps_rdp_min"] for x in v] + [x["eps_rdp_max"] for x in v]),
            "server": _span(server) if server else "inf"}


def table3(root: Path) -> str:
    """Table III beside the paper's: the reduced grid (C estimated) and the paper's C = 8.5."""
    main, c85 = _main_runs(_runs(root, REDUCED)), _main_runs(_runs(root, VARIANTS / "c85"))
    c_est = float(np.mean([s["clip_norm"] for s in main]))
    label = {"vanilla": "Vanilla FL", "gdp": f"FL + GDP (C = {c_est:.2f} est.)", "pdp": f"FL + PDP (C = {c_est:.2f} est.)"}
    lines = ["| setting | MAE | MRE | paper MAE / MRE | eps (release) | eps (server view) |", "|---|---|---|---|---|---|"]
    rows = [(label[n], _setting_cells(main, n), n) for n in SETTINGS]
    rows += [(f"FL + {n.upper()}, paper's C = 8.5" + (" (`--clip-norm 8.5`)" if n == "gdp" else ""),
              _setting_cells(c85, n), n) for n in ("gdp", "pdp")]
    for text, c, n in rows:
        paper = " / ".join(PAPER_TABLE3[n])
        lines.append(f"| {text} | {c['MAE']} | {c['MRE']} | {paper} | {c['release']} | {c['server']} |")
    return "\n".join(lines)


def table2(root: Path) -> str:
    """Anonymization beside the paper's Table II (identical in every run: the table is fixed)."""
    first = _main_runs(_runs(root, REDUCED))[0]
    harm = list(first["anonymization"].values())
    real = read_json(root / REAL)
    rr = real["rows"]
    names = [q for q in real["quasi_identifiers"]]
    lines = ["| | ours | paper |", "|---|---|---|",
             f"| harmonized levels [Age, Gender, Year, Type] | {first['levels']} on all {len(harm)} clients | "
             f"{PAPER_TABLE2['levels']} |",
             f"| suppressed records per client | {_span([h['suppressed'] for h in harm])} "
             f"(of {_span([h['n_original'] for h in harm])}) | - |",
             f"| ARIREC per client | {_span([h['arirec'] for h in harm], '{:.4f}')} | "
             "{:.4f}-{:.4f} |".format(*PAPER_TABLE2["arirec"]),
             f"| t-closeness (raw score) | {_span([h['t'] for h in harm], '{:.3f}')} | "
             "{:.2f}-{:.2f} |".format(*PAPER_TABLE2["t"]),
             f"| k / l | {_span([h['k'] for h in harm], '{}')} / {_span([h['l'] for h in harm], '{}')} | - |",
             f"| same on the real partial file (no Year) | levels {real['levels']} ({', '.join(names)}); ARIREC "
             f"{_span([r['ARIREC'] for r in rr], '{:.3f}')}; t {_span([r['t'] for r in rr], '{:.2f}')} | - |"]
    return "\n".join(lines)


def _detection(runs: list[dict[str, Any]]) -> dict[str, str]:
    out = {}
    for kind in POISONS:
        picked = [s for s in runs if s["poison"] == kind]
        if picked:
            r = detection_rates([s["drift"]["flagged"] for s in picked], [s["poisoned_client"] for s in picked],
                                [s["drift"]["client_ids"] for s in picked])
            out[kind] = f"{r['detections']}/{r['poisoned_runs']}"
    everything = detection_rates([s["drift"]["flagged"] for s in runs], [s["poisoned_client"] for s in runs],
                                 [s["drift"]["client_ids"] for s in runs])
    out["fp"] = f"{everything['false_positives']}/{everything['honest_client_checks']}"
    ratios = []  # how far each falsely flagged honest client's median divergence was from the median client's
    for s in runs:
        med = np.asarray(s["drift"]["median_divergence"])
        ids = s["drift"]["client_ids"]
        ratios += [med[ids.index(c)] / np.median(med) for c in s["drift"]["flagged"] if c != s["poisoned_client"]]
    out["fp_ratio"] = ", ".join(f"{r:.2f}" for r in sorted(ratios)) or "-"
    out["detected"] = f"{everything['detections']}/{everything['poisoned_runs']}"
    return out


def _audits(root: Path, folder: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(summary, audit.json) of each audited run kept under ``folder``."""
    paths = sorted((root / folder / "tabular-pdp" / "runs").glob("*/audit.json"))
    if not paths:
        raise FileNotFoundError(f"no kept audited tabular-pdp run under {folder}/tabular-pdp/runs")
    return [(read_json(p.parent / "summary.json"), read_json(p)) for p in paths]


def _g(x: float) -> str:
    return f"{x:.3g}"


def audit_table(root: Path) -> str:
    """The audit at n_eps = 1: per-client ranges and the pooled row of each setting, with the run's verdict."""
    ((summary, audit),) = _audits(root, AUDIT / "n1")
    lines = ["| setting | client | eps formal (study, RDP) | eps formal (add/remove) | lower bound (95%): all "
             "iterates / final model | point estimate: all iterates / final model | verdict |",
             "|---|---|---|---|---|---|---|"]
    for setting, res in sorted(setting_results(audit).items()):
        acct = summary["settings"][setting]["accounting"]
        clients = {c: v for c, v in res["clients"].items() if c != "all"}
        pooled = res["clients"]["all"]

        def span(view: str, key: str, clients: dict[str, Any] = clients) -> str:
            return _span([v[view][key] for v in clients.values()], "{:.3g}")

        per = [f"{span('all-iterates', 'eps_lower')} / {span('final-model', 'eps_lower')}",
               f"{span('all-iterates', 'eps_point')} / {span('final-model', 'eps_point')}"]
        verdicts = sorted({v.get("verdict", {}).get("verdict", "n/a") for v in clients.values()})
        lines.append(f"| {setting.upper()} | {min(clients, key=int)}..{max(clients, key=int)} (range) | "
                     f"{_span([acct[c]['eps_rdp'] for c in clients], '{:.3g}')} | "
                     f"{_span([v['eps_formal_add_remove'] for v in clients.values()], '{:.3g}')} | {per[0]} | "
                     f"{per[1]} | {', '.join(verdicts)} |")
        lines.append(f"| {setting.upper()} | all {len(clients)} pooled ({res['canaries']['num_canaries']} canaries) "
                     f"| - | max {_g(pooled['eps_formal_add_remove'])} | {_g(pooled['all-iterates']['eps_lower'])} / "
                     f"{_g(pooled['final-model']['eps_lower'])} | {_g(pooled['all-iterates']['eps_point'])} / "
                     f"{_g(pooled['final-model']['eps_point'])} | {pooled.get('verdict', {}).get('verdict', 'n/a')} |")
    return "\n".join(lines)


def _audit_values(root: Path) -> dict[str, str]:
    ((summary, audit),) = _audits(root, AUDIT / "n1")
    out = {"audit.verdict": audit["verdict"],
           "audit.sigma_ratio": f"{summary['settings']['pdp']['sigma_release_over_gdp']:.4f}",
           "audit.ceiling": _g(max(v.get("verdict", {}).get("ceiling") or 0.0 for r in setting_results(audit).values()
                                   for c, v in r["clients"].items() if c != "all"))}
    points = [r["clients"]["all"][view]["eps_point"] for r in setting_results(audit).values()
              for view in ("all-iterates", "final-model")]
    out["audit.pooled_points"] = _span(points, "{:.2f}")
    per_client = [v[view]["eps_point"] for r in setting_results(audit).values() for c, v in r["clients"].items()
                  if c != "all" for view in ("all-iterates", "final-model")]
    out["audit.client_points"] = _span(per_client, "{:.1f}")
    out["audit.formal"] = _g(max(r["clients"]["all"]["eps_formal_add_remove"] for r in setting_results(audit).values()))
    ((_, paper),) = _audits(root, AUDIT / "paper")
    out["audit.paper_points"] = _span([v[view]["eps_point"] for r in setting_results(paper).values()
                                       for v in r["clients"].values() for view in ("all-iterates", "final-model")],
                                      "{:.0f}")
    out["audit.paper_verdict"] = paper["verdict"]
    return out


def values(root: Path) -> Mapping[str, str]:
    """Prose numbers: the estimated C, the vanilla cell of the C = 8.5 sweep, the drift detection counts."""
    runs = _runs(root, REDUCED)
    main, c85 = _main_runs(runs), _main_runs(_runs(root, VARIANTS / "c85"))
    out = {"c_est": f"{np.mean([s['clip_norm'] for s in main]):.2f}",
           "c85_vanilla_mae": seed_cell([s["settings"]["vanilla"]["final_mae"] for s in c85], 3).split(" [")[0]}
    out.update({f"det.{k}": v for k, v in _detection(runs).items()})
    out.update({f"e2.{k}": v for k, v in _detection(_runs(root, VARIANTS / "e2")).items()})
    out.update(_audit_values(root))
    ratios = [s["settings"]["pdp"]["sigma_release_over_gdp"] for s in main]
    out["pdp_over_gdp"] = _span(ratios, "{:.5f}")
    spread = [(max(a) - min(a)) / float(np.mean(a)) for a in
              ([c["arirec"] for c in s["anonymization"].values()] for s in main)]
    out["arirec_spread_pct"] = _span([100 * x for x in spread], "{:.0f}")
    return out


def card_table(root: Path) -> str:
    """The report card at the CPU scale: the card's own rows (flower_apps.tabular_pdp.card) of the kept runs."""
    from flower_apps.common.report_card import build_card
    from flower_apps.common.tables import markdown_table
    from flower_apps.tabular_pdp.card import CARD

    records = CARD.collect(root / ATTACKS / "tabular-pdp")
    if not records:
        raise FileNotFoundError(f"no kept runs under {ATTACKS}/tabular-pdp/runs")
    return markdown_table(build_card(CARD, records), "card").split("\n", 2)[2].rstrip("\n")


def card_values(root: Path) -> Mapping[str, str]:
    """Prose numbers beside the card: ranges of the per-condition means, attribute inference on members vs not."""
    from flower_apps.tabular_pdp.card import CARD

    records = CARD.collect(root / ATTACKS / "tabular-pdp")
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["condition"], []).append(r)
    mia = [float(np.mean([r["mia_auc"] for r in rs])) for rs in by.values()]
    attr = [float(np.mean([r["attribute_adv"] for r in rs])) for rs in by.values()]
    rows = [r for p in sorted((root / ATTACKS / "tabular-pdp").glob("**/runs/*/attacks.json"))
            for r in read_json(p)["rows"] if r["attack"] == "attribute-inference"]
    gap = [r["membership_advantage"] for r in rows]
    return {"mia": _span(mia, "{:.3f}"), "attr": _span(attr, "{:.3f}"), "models": str(len(rows)),
            "attr_gap": f"{np.mean(gap):+.4f} +- {np.std(gap, ddof=1):.3f}", "runs": str(len(by))}


BLOCKS = {"tabular-pdp-card-table": card_table, "tabular-pdp-table2": table2, "tabular-pdp-table3": table3,
          "tabular-pdp-audit-table": audit_table}
VALUES = {"tabular-pdp-reduced": values, "tabular-pdp-card": card_values}
