"""The ultrasound parts of docs/ultrasound.md generated from the kept 160 px grid (``python -m flower_apps.report --check``).

Data: ``results_us_cpu/ultrasound/runs/*/summary.json`` (the ``cpu`` grid, 3 seeds per cell). Rendered: the
non-DP normal-vs-abnormal (IID) cell of each method with two intervals, over seeds (training only) and with
the shared test set's sampling error added (:mod:`flower_apps.ultrasound.sampling_variance`), and whether the
issue's AUC target (0.90) holds on the mean and on the interval. See :mod:`flower_apps.common.doc_blocks`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flower_apps.common.bench_table import kept_rows_block
from flower_apps.common.results import read_json
from flower_apps.ultrasound.report import results_rows
from flower_apps.ultrasound.sampling_variance import combine, run_ses

GRID = Path("results_us_cpu") / "ultrasound" / "runs"
CELL = "normal-vs-abnormal_iid_efficientnet_lite0_{method}_nodp_160px_K8_T10_E3_busi_s*"
METHODS = ("fedavg", "fedprox", "fedadam", "centralized")
AUC_TARGET = 0.90  # the target for normal vs abnormal


def _cell(root: Path, method: str) -> list[dict[str, Any]]:
    runs = [read_json(p / "summary.json") for p in sorted((root / GRID).glob(CELL.format(method=method)))
            if (p / "summary.json").is_file()]
    if not runs:
        raise FileNotFoundError(f"no kept run of {CELL.format(method=method)} under {GRID}")
    return sorted(runs, key=lambda s: s["seed"])


def target_values(root: Path) -> Mapping[str, str]:
    """Per method: mean test AUC, both 95% intervals, one run's test-sampling SE, the verdict on the target."""
    out = {"target": f"{AUC_TARGET:.2f}"}
    for method in METHODS:
        runs = _cell(root, method)
        aucs = [float(s["test_auc"]) for s in runs]
        ses = [run_ses(s)["auc"] for s in runs]
        if any(se is None for se in ses):
            raise ValueError(f"{method}: a binary run without a test-sampling SE")
        cell = combine(aucs, [float(se) for se in ses if se is not None])
        lo_t, hi_t = cell.training
        lo, hi = cell.with_test
        out[f"{method}.mean"] = f"{cell.mean:.3f}"
        out[f"{method}.training"] = f"[{lo_t:.3f}, {hi_t:.3f}]"
        out[f"{method}.with_test"] = f"[{lo:.3f}, {hi:.3f}]"
        out[f"{method}.test_se"] = f"{cell.test_se:.3f}"
        out[f"{method}.verdict"] = ("met with confidence" if lo >= AUC_TARGET else
                                    "met on the mean only" if cell.mean >= AUC_TARGET else "not met")
    return out


TASK_LABEL = {"benign-vs-malignant": "benign vs malignant", "normal-vs-abnormal": "normal vs abnormal",
              "three-class": "three classes"}
SCALE = "busi 160px K8 T10 E3"  # the kept cpu grid's scale label (flower_apps.ultrasound.report)


def nodp_table(root: Path) -> str:
    """docs/ultrasound.md's Tables 5-10 (no DP-SGD): the kept grid's cells through the sweep report's own rows
    (flower_apps.ultrasound.report.results_rows), with the intervals that add the test set's sampling error."""
    summaries = [read_json(p) for p in sorted((root / GRID).glob("*/summary.json"))]
    rows = [r for r in results_rows(summaries, dp=False) if r["scale"] == SCALE and r["arch"] == "efficientnet_lite0"]
    if not rows:
        raise FileNotFoundError(f"no kept non-DP run of the cpu grid ({SCALE}) under {GRID}")
    head = ["task", "partition", "method", "seeds", "accuracy (%)", "macro F1 (%)", "ROC-AUC (%)", "majority (%)",
            "accuracy with test sampling (%)", "ROC-AUC with test sampling (%)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (r["task"], r["partition"])):  # stable: the report's method order stays
        lines.append("| " + " | ".join([TASK_LABEL[r["task"]], r["partition"], r["method"], str(r["seeds"]),
                                        r["accuracy (%)"], r["f1 (%)"], r["auc (%)"], f"{r['_majority']:.2f}",
                                        r["accuracy with test sampling (%)"], r["AUC with test sampling (%)"]]) + " |")
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[Path], str]] = {"ultrasound-nodp-table": nodp_table}
VALUES: dict[str, Callable[[Path], Mapping[str, str]]] = {"ultrasound-target": target_values}


TASK_ORDER = ("normal-vs-abnormal", "benign-vs-malignant", "three-class")


def _signed(x: float) -> str:
    return f"{x:+.2f}"


def dp_table(root: Path) -> str:
    """docs/ultrasound.md's DP-SGD table (Tables 12-14 at the grid's recipe) beside each cell's non-DP run:
    the sweep report's own rows (flower_apps.ultrasound.report.results_rows) of the kept grid, the DP cost
    being the non-DP mean minus the DP mean (points)."""
    summaries = [read_json(p) for p in sorted((root / GRID).glob("*/summary.json"))]

    def ours(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rows if r["scale"] == SCALE and r["arch"] == "efficientnet_lite0"]

    dp, nodp = ours(results_rows(summaries, dp=True)), ours(results_rows(summaries, dp=False))
    if not dp:
        raise FileNotFoundError(f"no kept DP-SGD run of the cpu grid ({SCALE}) under {GRID}")
    base = {(r["task"], r["partition"], r["method"]): r for r in nodp}
    head = ["task", "partition", "method", "seeds", "accuracy (%)", "macro F1 (%)", "ROC-AUC (%)", "majority (%)",
            "no-DP accuracy / AUC (%) [seeds]", "DP cost, accuracy / AUC (pp)", "eps per client: RDP (paper sqrt(T))"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(dp, key=lambda r: (TASK_ORDER.index(r["task"]), r["partition"])):  # the report's method order stays
        b = base.get((r["task"], r["partition"], r["method"]))
        if b is None:
            no_dp, cost = "not run", "-"
        else:
            no_dp = f"{b['accuracy (%)']} / {b['auc (%)']} [{b['seeds']}]"
            cost = (f"{_signed(b['_accuracy'].mean - r['_accuracy'].mean)} / "
                    f"{_signed(b['_auc'].mean - r['_auc'].mean)}")
        lines.append("| " + " | ".join([TASK_LABEL[r["task"]], r["partition"], r["method"], str(r["seeds"]),
                                        r["accuracy (%)"], r["f1 (%)"], r["auc (%)"], f"{r['_majority']:.2f}",
                                        no_dp, cost, f"{r['eps RDP (max client)']} ({r['eps paper sqrt(T)']})"]) + " |")
    return "\n".join(lines)


BLOCKS["ultrasound-dp-table"] = dp_table


PAPER_QUOTES = Path("results_paper") / "ultrasound" / "paper_quotes.json"


def _range(vals: list[float], fmt: str = "{:.2f}", sep: str = "-") -> str:
    """``lo-hi`` in ``fmt`` (one value when both print the same)."""
    lo, hi = fmt.format(min(vals)), fmt.format(max(vals))
    return lo if lo == hi else f"{lo}{sep}{hi}"


def paper_table(root: Path) -> str:
    """docs/ultrasound.md's "Beside the paper's numbers": each quoted setting's cells of the kept grid (one
    method: mean [95% t-interval]; several: the span of their means) beside the paper's quoted accuracy
    (``results_paper/ultrasound/paper_quotes.json``)."""
    summaries = [read_json(p) for p in sorted((root / GRID).glob("*/summary.json"))]
    rows = {dp: [r for r in results_rows(summaries, dp=dp) if r["scale"] == SCALE and r["arch"] == "efficientnet_lite0"]
            for dp in (False, True)}
    head = ["task", "setting", "this grid: accuracy (%) [95% interval]", "this grid: ROC-AUC (%)", "majority class (%)",
            "paper: accuracy (%)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for q in read_json(root / PAPER_QUOTES)["rows"]:
        cells = [r for r in rows[q["dp"]] if r["task"] == q["task"] and r["partition"] == q["partition"]
                 and r["method"] in q["methods"]]
        if len(cells) != len(q["methods"]):
            raise FileNotFoundError(f"{q['task']} / {q['setting']}: {len(cells)} of {len(q['methods'])} cells kept")
        seeds = sorted({c["seeds"] for c in cells})
        seed_text = f"{'/'.join(map(str, seeds))} seeds"
        if len(cells) == 1:
            c = cells[0]
            acc = f"{c['_accuracy'].mean:.2f} [{c['_accuracy'].ci_low:.2f}, {c['_accuracy'].ci_high:.2f}] ({seed_text})"
            auc = f"{c['_auc'].mean:.2f} [{c['_auc'].ci_low:.2f}, {c['_auc'].ci_high:.2f}]"
        else:
            acc = f"{_range([c['_accuracy'].mean for c in cells])} (means; {seed_text})"
            auc = _range([c["_auc"].mean for c in cells])
        lines.append("| " + " | ".join([TASK_LABEL[q["task"]], q["setting"], acc, auc,
                                        f"{cells[0]['_majority']:.2f}", q["paper"]]) + " |")
    return "\n".join(lines)


BLOCKS["ultrasound-paper-table"] = paper_table


def dp_values(root: Path) -> Mapping[str, str]:
    """The prose numbers about the grid's DP-SGD runs: the epsilon ranges (RDP and the paper's sqrt(T) formula,
    worst client per run) and, on normal vs abnormal, the per-run AUC range, the run count and the accuracy that
    every one of those runs scores (the always-abnormal rate, when they all predict one class)."""
    runs = _dp_runs(root)
    nva = [s for s in runs if s["task"] == "normal-vs-abnormal"]
    accs = {f"{100 * s['test_accuracy']:.2f}" for s in nva}
    specs = {float(s["test_specificity"]) for s in nva}
    return {
        "eps_rdp": _range([s["accounting"]["eps_rdp_max"] for s in runs], "{:.3g}"),
        "eps_paper": _range([s["accounting"]["eps_paper_sqrtT_max"] for s in runs], "{:.3g}"),
        "nva.auc": _range([s["test_auc"] for s in nva], "{:.2f}"),
        "nva.runs": str(len(nva)),
        "nva.accuracy": accs.pop() if len(accs) == 1 else "varies",
        "nva.specificity": f"{specs.pop():g}" if len(specs) == 1 else "varies",
    }


VALUES["ultrasound-dp"] = dp_values


METHOD_ORDER = ("fedavg", "fedprox", "fedadam", "centralized", "local")
METHOD_LABEL = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedadam": "FedAdam", "centralized": "centralized",
                "local": "local-only"}


def _per_class(s: dict[str, Any]) -> str:
    """Test images of each class called right (the kept confusion matrix's diagonal; rows: true class)."""
    conf = s["confusion"]
    return ", ".join(str(conf[i][i]) for i in range(len(conf)))


def _class_totals(s: dict[str, Any]) -> str:
    conf = s["confusion"]
    return ", ".join(f"{name} {sum(conf[i])}" for i, name in enumerate(s["class_names"]))


def per_seed_table(root: Path) -> str:
    """Every kept run of the 160 px grid, one row per cell and one column group per seed: test accuracy, ROC-AUC,
    the test images of each class called right (the confusion matrix's diagonal; local-only: summed over the 8
    clients' models, each scored on the whole test set) and the run's wall time. The prose of docs/ultrasound.md
    reads its per-seed statements from this table."""
    runs = [s for s in (read_json(p) for p in sorted((root / GRID).glob("*/summary.json")))
            if s.get("arch") == "efficientnet_lite0" and s.get("image_size") == 160]
    if not runs:
        raise FileNotFoundError(f"no kept run of the cpu grid under {GRID}")
    cells: dict[tuple[str, str, bool, str], dict[int, dict[str, Any]]] = {}
    for s in runs:
        cells.setdefault((s["task"], s["partition"], bool(s["dp_sgd"]), s["method"]), {})[int(s["seed"])] = s
    seeds = sorted({seed for by_seed in cells.values() for seed in by_seed})
    head = ["task", "partition", "DP-SGD", "method", "accuracy (%) by seed", "ROC-AUC by seed",
            "test images called right per class, by seed", "wall (min) by seed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(cells, key=lambda k: (TASK_ORDER.index(k[0]), k[1], k[2], METHOD_ORDER.index(k[3]))):
        task, part, dp, method = key
        by_seed = cells[key]

        def per_seed(fn: Any, by_seed: dict[int, dict[str, Any]] = by_seed) -> str:
            return " / ".join(fn(by_seed[i]) if i in by_seed else "-" for i in seeds)

        lines.append("| " + " | ".join([
            TASK_LABEL[task], part, "C = 1.5, z = 2" if dp else "-", METHOD_LABEL[method],
            per_seed(lambda s: f"{100 * s['test_accuracy']:.1f}"), per_seed(lambda s: f"{s['test_auc']:.3f}"),
            per_seed(_per_class), per_seed(lambda s: f"{s['wall_seconds'] / 60:.1f}")]) + " |")
    totals: dict[str, str] = {}
    for s in runs:
        totals.setdefault(f"{TASK_LABEL[s['task']]}{' (local-only)' if s['method'] == 'local' else ''}",
                          _class_totals(s))
    classes = "; ".join(f"{task}: {totals[task]}" for task in sorted(totals))
    return "\n".join(lines) + (f"\n\nSeeds {' / '.join(map(str, seeds))}. The per-class cells list the classes in "
                               f"this order, out of these test images ({classes}; local-only sums the 8 clients' "
                               f"models, each scored on the whole test set). From `{GRID.as_posix()}/*/summary.json`.")


BLOCKS["ultrasound-per-seed"] = per_seed_table


def _dp_runs(root: Path) -> list[dict[str, Any]]:
    runs = [s for s in (read_json(p) for p in sorted((root / GRID).glob("*/summary.json")))
            if s.get("dp_sgd") and s.get("arch") == "efficientnet_lite0" and s.get("image_size") == 160]
    if not runs:
        raise FileNotFoundError(f"no kept DP-SGD run of the cpu grid under {GRID}")
    return runs


def _worst(acc: dict[str, Any], key: str) -> dict[str, Any]:
    return max(acc["per_client"], key=lambda c: c[key])


def dp_eps_table(root: Path) -> str:
    """Per task and partition: the most exposed client's epsilon under the RDP accountant and under the paper's
    sqrt(T) formula, each with that client's sampling rate and steps, per seed (the runs' ``accounting``; the
    three FL methods of one split share it)."""
    cells: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for s in _dp_runs(root):
        cells.setdefault((s["task"], s["partition"]), {}).setdefault(int(s["seed"]), s["accounting"])
    head = ["task", "partition", "seed", "eps RDP, most exposed client (q, steps)",
            "eps paper sqrt(T), most exposed client (q, steps)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (task, part) in sorted(cells, key=lambda k: (TASK_ORDER.index(k[0]), k[1])):
        for seed, acc in sorted(cells[(task, part)].items()):
            r, p = _worst(acc, "eps_rdp"), _worst(acc, "eps_paper_sqrtT")
            lines.append(f"| {TASK_LABEL[task]} | {part} | {seed} | {r['eps_rdp']:.3g} (client {r['client']}: "
                         f"{r['sample_rate']:.2g}, {r['steps']}) | {p['eps_paper_sqrtT']:.3g} (client {p['client']}: "
                         f"{p['sample_rate']:.2g}, {p['steps']}) |")
    return "\n".join(lines) + f"\n\ndelta = {acc['delta']:g}; from the DP runs' `accounting` in `{GRID.as_posix()}`."


BLOCKS["ultrasound-dp-eps"] = dp_eps_table


def grid_values(root: Path) -> Mapping[str, str]:
    """Prose numbers about the non-DP grid: federated minus centralized accuracy (3-seed means, points) per
    partition and per task, how many local-only runs end below the majority class, and the DP cost ranges
    (non-DP mean minus DP mean, points) per task and partition."""
    summaries = [read_json(p) for p in sorted((root / GRID).glob("*/summary.json"))]
    rows = {dp: [r for r in results_rows(summaries, dp=dp) if r["scale"] == SCALE and r["arch"] == "efficientnet_lite0"]
            for dp in (False, True)}
    by = {(r["task"], r["partition"], r["method"]): r for r in rows[False]}
    out: dict[str, str] = {}
    fl = [r for r in rows[False] if r["method"] not in ("Centralized", "Local-only")]
    if not fl:
        raise FileNotFoundError(f"no kept federated run of the cpu grid under {GRID}")
    central = {k[:2]: r for k, r in by.items() if k[2] == "Centralized"}
    local = {k[:2]: r for k, r in by.items() if k[2] == "Local-only"}
    for part in ("iid", "non-iid"):
        deltas = {t: [r["_accuracy"].mean - central[(t, part)]["_accuracy"].mean for r in fl
                      if r["task"] == t and r["partition"] == part] for t in TASK_ORDER}
        out[f"fl_minus_central.{part}"] = _range([d for ds in deltas.values() for d in ds], "{:+.1f}", " to ")
        for t, ds in deltas.items():
            out[f"fl_minus_central.{part}.{t}"] = _range(ds, "{:+.1f}", " to ")
        below = [fr["_accuracy"].mean < local[(t, part)]["_accuracy"].mean for t in TASK_ORDER for fr in fl
                 if fr["task"] == t and fr["partition"] == part]
        out[f"local_below_every_fl.{part}"] = "yes" if all(not b for b in below) else "no"
    widths = sorted(r["_accuracy"].ci_high - r["_accuracy"].ci_low for r in rows[False])
    out["nodp.acc_ci_width"] = f"{widths[0]:.0f}-{widths[-1]:.0f}"
    out["nodp.acc_ci_width_median"] = f"{float(np.median(widths)):.0f}"
    for part in ("iid", "non-iid"):  # three classes: normal test images the federated models call normal
        right = [s["confusion"][0][0] for s in summaries if s.get("task") == "three-class" and s.get("image_size") == 160
                 and s.get("partition") == part and not s.get("dp_sgd") and s.get("mode") == "federated"]
        if right:
            out[f"three_class.normal_right.{part}"] = (f"{min(right)}-{max(right)} of 13 (mean {sum(right) / len(right):.1f} "
                                                       f"over {len(right)} runs)")
    local_runs = [s for s in summaries if s.get("method") == "local" and s.get("partition") == "non-iid"
                  and s.get("image_size") == 160]
    out["local_noniid_below_majority"] = (f"{sum(_below_majority(s) for s in local_runs)} of {len(local_runs)}")
    for t in TASK_ORDER:
        for part in ("iid", "non-iid"):
            pairs = [(by[(r["task"], r["partition"], r["method"])], r) for r in rows[True]
                     if r["task"] == t and r["partition"] == part]
            acc = [b["_accuracy"].mean - d["_accuracy"].mean for b, d in pairs]
            auc = [b["_auc"].mean - d["_auc"].mean for b, d in pairs]
            out[f"dp_cost.{t}.{part}.accuracy"] = f"{min(acc):.1f} to {max(acc):.1f}"
            out[f"dp_cost.{t}.{part}.auc"] = f"{min(auc):.1f} to {max(auc):.1f}"
    return out


def _below_majority(s: dict[str, Any]) -> bool:
    conf = s["confusion"]
    return s["test_accuracy"] < max(sum(row) for row in conf) / sum(sum(row) for row in conf)


VALUES["ultrasound-grid"] = grid_values


# The study's kept benchmark rows (results_bench/benchmarks.json, python -m benchmarks): docs/ultrasound.md's
# "Measured speed-ups" and "DP-SGD overhead".
BLOCKS["ultrasound-bench"] = kept_rows_block(("channels-last", "centralized-threads", "dp-frozen-prefix",
                                              "dp-head-feature-cache"))
BLOCKS["ultrasound-dpsgd-bench"] = kept_rows_block(("dpsgd-overhead",))


AUDIT_SMOKE = Path("results_audit") / "smoke"


def audit_smoke_table(root: Path) -> str:
    """The kept smoke-scale audited ultrasound runs (``flower_apps.ultrasound.audit.audit_rows``): gradient
    canaries on the DP-SGD run (the audit with a verdict), random-pixel and mislabelled input-space canaries."""
    from flower_apps.ultrasound.audit import audit_rows
    from flower_apps.ultrasound.report import load_summaries

    rows = audit_rows(load_summaries(root / AUDIT_SMOKE))
    if not rows:
        raise FileNotFoundError(f"no audited ultrasound runs under {AUDIT_SMOKE}/ultrasound/runs")
    head: list[str] = []
    for r in rows:
        head += [c for c in r if c not in head and c not in ("run", "method")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r.get(c, "-")) for c in head) + " |" for r in rows]
    return "\n".join(lines) + f"\n\nKept: `{AUDIT_SMOKE.as_posix()}/ultrasound/runs/` ({', '.join(r['run'] for r in rows)})."


BLOCKS["ultrasound-audit-smoke"] = audit_smoke_table


def audit_values(root: Path) -> Mapping[str, str]:
    """The one-run audit's ceiling: the largest epsilon m canaries can certify when every guess is right (95%,
    Bonferroni over the four k choices), computed by the audit's own statistics (privacy.audit.example_level)."""
    from privacy.audit.example_level import audit_from_scores

    out = {}
    for m in (16, 32, 64, 128, 1000):
        included = np.arange(m) % 2 == 0
        out[f"ceiling.{m}"] = f"{audit_from_scores(included.astype(float), included, 1e-5).eps_lower:.2f}"
    return out


VALUES["ultrasound-audit"] = audit_values


ATTACKS = Path("results_reduced") / "ultrasound-attacks" / "ultrasound"


def card_table(root: Path) -> str:
    """The report card at smoke scale: the card's own rows (flower_apps.ultrasound.card) of the kept attacked runs."""
    from flower_apps.common.report_card import build_card
    from flower_apps.common.tables import markdown_table
    from flower_apps.ultrasound.card import CARD

    records = CARD.collect(root / ATTACKS)
    if not records:
        raise FileNotFoundError(f"no kept attacked runs under {ATTACKS}/runs")
    return (markdown_table(build_card(CARD, records), "card").split("\n", 2)[2].rstrip("\n")
            + f"\n\nKept: `{ATTACKS.as_posix()}/runs/` (`attacks_mia.json`, `attacks_inversion.json` per run).")


def attack_values(root: Path) -> Mapping[str, str]:
    """Prose numbers beside the smoke card, per run (``nodp`` / ``dp``): the strongest membership attack's AUC
    and name (flower_apps.common.report_card.strongest_mia), the members attacked, the best inversion attack's
    mean SSIM in the view that run releases and the PSNR range of its reconstructions."""
    from flower_apps.common.report_card import attack_rows, best_ssim, strongest_mia

    out: dict[str, str] = {}
    for run in sorted((root / ATTACKS / "runs").glob("*")):
        s = read_json(run / "summary.json")
        key = "dp" if s.get("dp_sgd") else "nodp"
        mia_rows = attack_rows(read_json(run / "attacks_mia.json"))
        mia = strongest_mia(mia_rows)
        out[f"{key}.mia_auc"] = f"{mia['mia_auc']:.3f}"
        out[f"{key}.mia_attack"] = mia["mia_attack"]
        out[f"{key}.members"] = str(max(int(r.get("n_target_members", 0)) for r in mia_rows))
        view = "dp-sgd" if s.get("dp_sgd") else "gradient"
        inv = [r for r in attack_rows(read_json(run / "attacks_inversion.json")) if r.get("view") == view]
        ssim = best_ssim(inv)
        out[f"{key}.ssim_max"] = "-" if ssim is None else f"{ssim:.3f}"
        psnr = [float(r["psnr"]) for r in inv if r.get("psnr") is not None]
        out[f"{key}.psnr"] = f"{min(psnr):.1f}-{max(psnr):.1f}" if psnr else "-"
    if not out:
        raise FileNotFoundError(f"no kept attacked runs under {ATTACKS}/runs")
    return out


BLOCKS["ultrasound-card"] = card_table
VALUES["ultrasound-attacks"] = attack_values


PROBE = Path("results_bench") / "ultrasound_linear_probe.json"


def probe_table(root: Path) -> str:
    """The linear probe of the offline Lite0 weights (benchmarks/ultrasound_linear_probe.py --keep)."""
    rec = read_json(root / PROBE)
    lines = ["| image size | ROC-AUC, ImageNet weights | ROC-AUC, random init (reference) | ratio |", "|---|---|---|---|"]
    lines += [f"| {r['image_size']} px | {r['auc_imagenet']:.3f} | {r['auc_random_init']:.3f} | {r['ratio']:.2f}x |"
              for r in rec["rows"]]
    return "\n".join(lines) + (f"\n\n{rec['task']}, {rec['per_class']} + {rec['per_class']} images, {rec['folds']}-fold "
                               f"cross-validated logistic regression on the pooled features; measured {rec['date'][:10]} "
                               f"by `{rec['benchmark']}`, kept in `{PROBE.as_posix()}`.")


BLOCKS["ultrasound-linear-probe"] = probe_table
