"""docs/audit.md's measured tables and numbers, rebuilt from the kept audit runs (``flower_apps.report --check``).

Data (all tracked): ``results_audit/reduced/{dfl-dp,tabular-pdp,ultrasound}/runs/*/{summary,audit}.json``
(the CPU-scale audited runs, with verdicts), ``results_audit/smoke/dfl-dp/runs/`` (the dfl-dp audit grid at
smoke scale, rerun under the current code for issue 39), ``results_audit/detection.jsonl`` (every detection
trial's verdict) and ``results_bench/benchmarks.json`` (the audit-overhead rows of the last benchmark run).

Every cell comes from the studies' own audit report code (``flower_apps.dfl_dp.audit_report.audit_rows``,
``flower_apps.tabular_pdp.audit_report.setting_results``, ``flower_apps.ultrasound.audit.audit_rows``) or the
audit's statistics (``privacy.audit.stats``); nothing here recomputes an epsilon. The audit spans three
studies, so the renderers live here, not in one study's ``docs.py``, and
:mod:`flower_apps.common.doc_blocks` registers :data:`BLOCKS` and :data:`VALUES` beside its other
platform-wide tables. The study modules are imported inside the functions: ``doc_blocks`` is imported by
``flower_apps.studies`` before any study is loaded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flower_apps.common.results import read_json
from privacy.audit.stats import format_eps, max_certifiable_epsilon

REDUCED = Path("results_audit") / "reduced"
SMOKE = Path("results_audit") / "smoke"
#: tabular-pdp's smoke audit at the study's own n_eps = 0.05 (the limit of the noise tests; docs/audit.md)
SMOKE_NEPS005 = Path("results_audit") / "smoke-neps0.05"
DETECTION = Path("results_audit") / "detection.jsonl"
BENCH = Path("results_bench") / "benchmarks.json"
FW_LABEL = {"fl": "FL", "sequential-dfl": "Sequential DFL"}


def _table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def dfl_dp_runs(root: Path, folder: Path) -> list[dict[str, Any]]:
    """The audited dfl-dp runs under ``folder`` (report row, summary, audit.json), by framework and eps_cal."""
    from flower_apps.dfl_dp.audit_report import audit_rows

    rows = audit_rows(root / folder)
    if not rows:
        raise FileNotFoundError(f"no audited dfl-dp runs under {folder}/dfl-dp/runs")
    runs = root / folder / "dfl-dp" / "runs"
    out = [{"row": r, "summary": read_json(runs / r["run"] / "summary.json"),
            "audit": read_json(runs / r["run"] / "audit.json")} for r in rows]
    return sorted(out, key=lambda x: (x["audit"]["framework"] != "fl", x["summary"]["eps_cal"]))


def dfl_dp_nodp_acc(root: Path, folder: Path) -> dict[str, float]:
    """Framework -> the final accuracy of the grid's No-DP run (the audited runs' utility reference)."""
    out = {}
    for p in sorted((root / folder / "dfl-dp" / "runs").glob("*/summary.json")):
        s = read_json(p)
        if not s["dp"] and not (p.parent / "audit.json").is_file():
            out[s["framework"]] = s["final_acc"]
    return out


def dfl_dp_table(folder: Path) -> Callable[[Path], str]:
    """The formal-vs-audited table of the dfl-dp audit grid kept under ``folder``."""

    def render(root: Path) -> str:
        nodp = dfl_dp_nodp_acc(root, folder)
        head = ["framework", "eps_cal", "eps formal (study, replace-one)", "eps formal (add/remove)",
                "formal mu (configured)", "all-iterates: lower bound (95%) / ceiling",
                "all-iterates: point estimate (fitted mu)", "final model: lower bound (95%)",
                "final model: point estimate", "verdict", "final acc (No-DP run)"]
        rows = []
        for x in dfl_dp_runs(root, folder):
            r, a, s = x["row"], x["audit"], x["summary"]
            ai = a["threat_models"]["all-iterates"]
            mu = a["configured"]["mu_formal"]
            rows.append([FW_LABEL[a["framework"]], f"{s['eps_cal']:g}", r["eps formal (study, replace-one)"],
                         r["eps formal (add/remove)"], f"{mu:.3g}" if a["eps_formal_add_remove"] < 500 else "-",
                         f"{r['all-iterates: lower bound (95%)']} / {format_eps(ai['max_certifiable_epsilon'])}",
                         f"{r['all-iterates: point estimate']} ({ai['mu_point']:.3g})",
                         r["final model: lower bound (95%)"], r["final model: point estimate"], r["verdict"],
                         f"{100 * s['final_acc']:.1f}% ({100 * nodp[a['framework']]:.1f}%)"])
        return _table(head, rows) + f"\n\nKept: `{folder.as_posix()}/dfl-dp/runs/` (seed {s['seed']})."

    render.__doc__ = f"dfl-dp formal vs audited epsilon, {folder}"
    return render


def tabular_runs(root: Path, folder: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(summary, audit.json) of each kept audited tabular-pdp run under ``folder``, by seed."""
    paths = sorted((root / folder / "tabular-pdp" / "runs").glob("*/audit.json"))
    if not paths:
        raise FileNotFoundError(f"no audited tabular-pdp runs under {folder}/tabular-pdp/runs")
    return sorted(((read_json(p.parent / "summary.json"), read_json(p)) for p in paths), key=lambda x: x[0]["seed"])


def _span(values: list[float], fmt: str = ".1f") -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def _tabular_cells(audit: dict[str, Any]) -> dict[str, dict[str, Any]]:
    from flower_apps.tabular_pdp.audit_report import setting_results

    return setting_results(audit)


def tabular_table(folder: Path) -> Callable[[Path], str]:
    """Per (setting, seed): the per-client ranges and the pooled row of the tabular-pdp audit under ``folder``."""

    def render(root: Path) -> str:
        return _tabular_table(root, folder)

    render.__doc__ = f"tabular-pdp formal vs audited epsilon, {folder}"
    return render


def _tabular_table(root: Path, folder: Path) -> str:
    head = ["setting", "seed", "eps formal (add/remove), per client", "per client: lower bound (95%), max",
            "per client: point estimates", "pooled (all clients' canaries): lower bound, all iterates / final",
            "pooled: point estimate (fitted mu / formal mu)", "noise measured / configured (pooled)", "verdict",
            "MAE"]
    rows = []
    for setting in ("gdp", "pdp"):
        for s, a in tabular_runs(root, folder):
            res = _tabular_cells(a)[setting]
            per = [c for cid, c in res["clients"].items() if cid != "all"]
            pooled = res["clients"]["all"]
            noise = next(t for t in pooled["verdict"]["tests"] if t["test"] == "measured-noise")
            rows.append([setting.upper(), str(s["seed"]), _span([c["eps_formal_add_remove"] for c in per]),
                         format_eps(max(c["all-iterates"]["eps_lower"] for c in per)),
                         _span([c["all-iterates"]["eps_point"] for c in per]),
                         f"{format_eps(pooled['all-iterates']['eps_lower'])} / "
                         f"{format_eps(pooled['final-model']['eps_lower'])}",
                         f"{format_eps(pooled['all-iterates']['eps_point'])} "
                         f"({pooled['all-iterates']['mu_point']:.2f} / {pooled['verdict']['mu_formal']:.2f})",
                         f"{noise['measured_over_configured']:.3f}", res["verdict"],
                         f"{s['settings'][setting]['final_mae']:.2f}"])
    return _table(head, rows) + f"\n\nKept: `{folder.as_posix()}/tabular-pdp/runs/`."


def ultrasound_table(root: Path) -> str:
    """The kept ultrasound DP-SGD audit rows (``flower_apps.ultrasound.audit.audit_rows``), run name aside."""
    from flower_apps.ultrasound.audit import audit_rows
    from flower_apps.ultrasound.report import load_summaries

    rows = audit_rows(load_summaries(root / REDUCED))
    if not rows:
        raise FileNotFoundError(f"no audited ultrasound runs under {REDUCED}/ultrasound/runs")
    head = [c for c in rows[0] if c not in ("run", "method")]
    return _table(head, [[str(r.get(c, "")) for c in head] for r in rows]) + \
        f"\n\nKept: `{REDUCED.as_posix()}/ultrasound/runs/` ({', '.join(r['run'] for r in rows)})."


def overhead_table(root: Path) -> str:
    """The audit-overhead rows of the kept benchmark run (``results_bench/benchmarks.json``)."""
    bench = read_json(root / BENCH)
    rows = [r for r in bench["rows"] if r["benchmark"] == "audit-overhead"]
    if not rows:
        raise ValueError(f"{BENCH} has no audit-overhead rows")
    body = [[f"`{r['metric']}`", f"{r['value']:.2f} s", f"{r['reference']:.2f} s", f"{r['ratio']:.2f}",
             f"ratio {r['op']} {r['target']:.2f}", "yes" if r["met"] else "**no**"] for r in rows]
    m = bench["machine"]
    return _table(["metric", "audited", "plain", "ratio", "target", "met"], body) + (
        f"\n\nKept: `{BENCH.as_posix()}` (`{bench['command']}`, {m['date']}, {m['cores']} cores, load average "
        f"{m['load']} at the start).")


def _pct_vs(point: float, formal: float) -> str:
    d = 100 * (point / formal - 1)
    return f"{abs(d):.1f}% {'above' if d > 0 else 'below'}"


def _dfl_values(root: Path, folder: Path, prefix: str, out: dict[str, str]) -> list[dict[str, Any]]:
    runs = dfl_dp_runs(root, folder)
    for fw, acc in dfl_dp_nodp_acc(root, folder).items():
        out[f"{prefix}.{fw}.nodp_acc"] = f"{100 * acc:.1f}"
    for x in runs:
        a, s = x["audit"], x["summary"]
        k = f"{prefix}.{a['framework']}.eps{s['eps_cal']:g}"
        ai, fm = a["threat_models"]["all-iterates"], a["threat_models"]["final-model"]
        out[f"{k}.formal"] = format_eps(a["eps_formal_add_remove"])
        out[f"{k}.mu_formal"] = f"{a['configured']['mu_formal']:.3g}"
        out[f"{k}.point"] = format_eps(ai["eps_point"])
        out[f"{k}.mu"] = f"{ai['mu_point']:.3g}"
        out[f"{k}.lower"] = format_eps(ai["eps_lower"])
        out[f"{k}.lower_final"] = format_eps(fm["eps_lower"])
        out[f"{k}.acc"] = f"{100 * s['final_acc']:.1f}"
        out[f"{k}.mean_in"] = f"{ai['mean_in']:.2f}"
        out[f"{k}.sd_in"] = f"{ai['sd_in']:.2g}"
        out[f"{k}.sd_out"] = f"{ai['sd_out']:.2g}"
        out[f"{k}.sd_ratio"] = f"{ai['sd_in'] / ai['sd_out']:.2g}"
        out[f"{k}.cv_in"] = f"{ai['sd_in'] / ai['mean_in']:.2f}"
        out[f"{k}.verdict"] = a["verdict"]
        if a["eps_formal_add_remove"] < 500:
            out[f"{k}.point_vs_formal"] = _pct_vs(ai["eps_point"], a["eps_formal_add_remove"])
    ceil = {format_eps(x["audit"]["threat_models"]["all-iterates"]["max_certifiable_epsilon"]) for x in runs}
    out[f"{prefix}.ceiling"] = " / ".join(sorted(ceil))
    walls = [read_json(p)["wall_seconds"] for p in (root / folder / "dfl-dp" / "runs").glob("*/summary.json")]
    out[f"{prefix}.wall_min"] = f"{sum(walls) / 60:.1f}"
    lo, hi = runs[0]["audit"]["canaries"]["norm_range_over_c"]
    # coefficient of variation of a uniform norm on [lo C, hi C]: the spread the norms alone give the scores
    out[f"{prefix}.norm_cv"] = f"{(hi - lo) / math.sqrt(12) / ((lo + hi) / 2):.2f}"
    out[f"{prefix}.norms"] = f"{lo:g}C-{hi:g}C"
    out[f"{prefix}.dim"] = f"{runs[0]['audit']['canaries']['dim']:,}"
    return runs


def _tab_values(root: Path, folder: Path, prefix: str, out: dict[str, str]) -> None:
    """``<prefix>.*``: ranges over the kept tabular-pdp audit under ``folder`` (per client and pooled)."""
    runs = tabular_runs(root, folder)
    per_formal, per_point, per_lower, pooled_point, pooled_lower, mae, noise = [], [], [], [], [], [], []
    for s, a in runs:
        for setting, res in _tabular_cells(a).items():
            for cid, c in res["clients"].items():
                if cid == "all":
                    pooled_point.append(c["all-iterates"]["eps_point"])
                    pooled_lower += [c["all-iterates"]["eps_lower"], c["final-model"]["eps_lower"]]
                    out[f"{prefix}.pooled_ceiling"] = format_eps(c["verdict"]["ceiling"])
                    continue
                per_formal.append(c["eps_formal_add_remove"])
                per_point.append(c["all-iterates"]["eps_point"])
                per_lower.append(c["all-iterates"]["eps_lower"])
                noise += [t["measured_over_configured"] for t in c["verdict"]["tests"] if t["test"] == "measured-noise"]
            mae.append(s["settings"][setting]["final_mae"])
    formal_max = max(per_formal)
    out[f"{prefix}.formal_max"] = format_eps(formal_max)
    out[f"{prefix}.pooled_point"] = _span(pooled_point)
    out[f"{prefix}.pooled_lower_max"] = format_eps(max(pooled_lower))
    out[f"{prefix}.per_lower_max"] = format_eps(max(per_lower))
    out[f"{prefix}.per_point"] = _span(per_point)
    out[f"{prefix}.per_rows"] = str(len(per_point))
    out[f"{prefix}.per_above_formal"] = str(sum(v > formal_max for v in per_point))
    out[f"{prefix}.per_noise"] = _span(noise, ".2f")
    out[f"{prefix}.mae"] = _span(mae)
    out[f"{prefix}.mae_vanilla"] = _span([s["settings"]["vanilla"]["final_mae"] for s, _ in runs], ".2f")
    out[f"{prefix}.seeds"] = _span([float(s["seed"]) for s, _ in runs], ".0f")
    out[f"{prefix}.runs"] = str(len(runs))
    out[f"{prefix}.wall_min"] = f"{sum(s['wall_seconds'] for s, _ in runs) / 60:.1f}"
    out[f"{prefix}.wall_runs"] = _span([s["wall_seconds"] for s, _ in runs], ".0f")
    out[f"{prefix}.clip"] = _span([s["clip_norm"] for s, _ in runs], ".2f")
    excluded = [f"seed {s['seed']} excluded " + ", ".join(s["regions"][str(c)] for c in s["drift"]["flagged"])
                for s, _ in runs if s["drift"]["flagged"]]
    out[f"{prefix}.excluded"] = "; ".join(excluded) or "no client excluded"
    out[f"{prefix}.sigma_ratio"] = _span([s["settings"]["pdp"]["sigma_release_over_gdp"] for s, _ in runs], ".4f")


def audit_values(root: Path) -> Mapping[str, str]:
    """Values docs/audit.md's prose quotes: ``reduced.*`` / ``smoke.*`` (dfl-dp), ``tab.*``, ``us.*``, ``det.*``."""
    out: dict[str, str] = {}
    _dfl_values(root, REDUCED, "reduced", out)
    _dfl_values(root, SMOKE, "smoke", out)
    # the half-split lower bound's ceiling at these canary counts (privacy.audit.stats)
    out["ceiling.200"] = format_eps(max_certifiable_epsilon(50, 50, 1e-5))
    out["ceiling.40"] = format_eps(max_certifiable_epsilon(10, 10, 1e-5))
    _tab_values(root, REDUCED, "tab", out)
    _tab_values(root, SMOKE, "tabsmoke", out)
    _tab_values(root, SMOKE_NEPS005, "tab005", out)
    (s, a), = tabular_runs(root, SMOKE_NEPS005)
    for setting, res in _tabular_cells(a).items():
        pooled = res["clients"]["all"]["verdict"]
        out[f"tab005.{setting}.verdict"] = res["verdict"]
        out[f"tab005.{setting}.powered"] = ", ".join(pooled["powered"]) or "none"
        out[f"tab005.{setting}.noise"] = next(f"{t['measured_over_configured']:.2f}" for t in pooled["tests"]
                                               if t["test"] == "measured-noise")
    out["tab005.n_eps"] = f"{s['noise_multiplier']:g}"
    a = read_json(next((root / REDUCED / "ultrasound" / "runs").glob("*/audit.json")))
    tests = {t["test"]: t for t in a["tests"]}
    out["us.eps_rdp"] = f"{a['eps_formal_rdp']:.3g}"
    out["us.noise"] = f"{a['measured_over_configured']:.2f}"
    out["us.mu_hat"] = f"{tests['separation']['mu_hat']:.2g}"
    out["us.mu_formal"] = f"{tests['separation']['mu_formal']:.3g}"
    out["us.lower"] = f"{tests['lower-bound']['eps_lower']:.3g}"
    out["us.ceiling"] = f"{tests['lower-bound']['ceiling']:.2g}"
    out["us.verdict"] = a["verdict"]
    trials = [json.loads(line) for line in (root / DETECTION).read_text().splitlines() if line.strip()]
    alarms = [t for t in trials if t["study"] == "tabular-pdp" and t["preset"] == "smoke" and not t["fault"]
              and t["verdict"] == "violation"]
    out["det.tab_alarm"] = "; ".join(f"seed {t['seed']}: {', '.join(t['fired'])}" for t in alarms) or "none"
    return out


BLOCKS: dict[str, Callable[[Path], str]] = {
    "audit-dfl-dp-reduced": dfl_dp_table(REDUCED),
    "audit-dfl-dp-smoke": dfl_dp_table(SMOKE),
    "audit-tabular-pdp-reduced": tabular_table(REDUCED),
    "audit-tabular-pdp-smoke": tabular_table(SMOKE),
    "audit-ultrasound-cpu": ultrasound_table,
    "audit-overhead": overhead_table,
}
VALUES: dict[str, Callable[[Path], Mapping[str, str]]] = {"audit": audit_values}
