"""The privacy report card of one study sweep: utility, formal and audited epsilon, attack success.

One row per condition (runs grouped over seeds): the study's main utility metric with its 95 %
t-interval, the formal epsilon from the run's accountant and its delta, the audited epsilon
(the one-run lower bound from ``audit.json`` when the audit ran, else "not run"), membership
inference (ROC-AUC and TPR at FPR 0.1 % of the strongest attack run, over shadow models, the
loss threshold and offline LiRA), the best inversion SSIM where the study has inversion, and for
unlinkable-dfl the sender-linking advantage and the mixnet entropies. A cell whose attack did
not run says "not run"; a condition without DP has epsilon "inf (no DP)".

Each collector reads only the files the study's server app and attack phase wrote
(``summary.json``, ``attacks*.json``, ``audit.json``, ``transport/*.json``) and returns plain
records; :func:`build_card` groups them, :func:`write_card` writes CSV + Markdown + one figure
(utility vs formal epsilon, with MIA AUC and audited epsilon beside it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from flower_apps.common.plots import save_fig, subplots
from flower_apps.common.results import read_json
from flower_apps.common.tables import group_by, seed_cell, write_table

NOT_RUN = "not run"
AUDITED = "skipped: audited run"
AUDITED_TAG = " [audited]"
TWIN_NOTE = " (audited twin)"
STUDIES = ("dfl-dp", "tabular-pdp", "ultrasound", "unlinkable-dfl")


def _runs(study_dir: Path) -> list[tuple[Path, dict]]:
    out = []
    for run in sorted((study_dir / "runs").glob("*/")):
        if (run / "summary.json").is_file():
            out.append((run, read_json(run / "summary.json")))
    return out


def _json(path: Path):
    return read_json(path) if path.is_file() else None


def _rows(obj) -> list[dict]:
    """Rows of an attack file: a list, ``{"rows": [...]}`` or ``{"row": {...}}``."""
    if obj is None:
        return []
    if isinstance(obj, list):
        return obj
    return obj.get("rows") or ([obj["row"]] if "row" in obj else [])


def is_audited_run(run: Path, summary: dict | None = None) -> bool:
    """True when ``run`` trained with audit canaries, read from the files the run wrote.

    Canaries change what is trained: dfl-dp and tabular-pdp add canary clients' updates to the
    aggregate, the ultrasound audit puts canary images into client 0's training set (and removes
    the mislabelled ones' originals). The released model is then not the condition's model, and
    client 0's training images are no longer its member set, so an attack on it would measure the
    audit, not the condition. Evidence: ``audit_canaries > 0`` in ``config.json`` (dfl-dp,
    tabular-pdp), an ``audit.json`` in the folder, or ``audit`` in ``summary.json`` (ultrasound).
    """
    run = Path(run)
    config = _json(run / "config.json") or {}
    if int(config.get("audit_canaries") or 0) > 0 or (run / "audit.json").is_file():
        return True
    summary = summary if summary is not None else (_json(run / "summary.json") or {})
    return bool(summary.get("audit"))


def audited_epsilon(run: Path, part: str | None = None) -> float | None:
    """Largest ``eps_lower`` in ``audit.json`` (the strongest audited threat model); None when absent.

    ``part``: a top-level key of ``audit.json`` to restrict to (a tabular setting), when present.
    """
    audit = _json(run / "audit.json")
    if audit is None:
        return None
    if part is not None and isinstance(audit, dict) and part in audit:
        audit = audit[part]
    found: list[float] = []

    def walk(o) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                if k == "eps_lower" and isinstance(v, (int, float)) and math.isfinite(v):
                    found.append(float(v))
                else:
                    walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(audit)
    return max(found) if found else None


def _mia(rows: Iterable[dict]) -> dict:
    """Strongest membership attack of one run: the max AUC and the max TPR at FPR 0.1 % over attacks."""
    rows = [r for r in rows if "auc" in r]
    if not rows:
        return {}
    best = max(rows, key=lambda r: r["auc"])
    name = best.get("attack") or f"{best.get('feature')}/{best.get('classifier')}"
    return {"mia_auc": float(best["auc"]), "mia_attack": name,
            "mia_tpr_0.001": max(float(r["tpr_at_fpr_0.001"]) for r in rows)}


def _ssim(rows: Iterable[dict]) -> float | None:
    """Best attack's mean SSIM over the attacked images (a run's inversion result)."""
    by = group_by([r for r in rows if "ssim" in r], lambda r: r["attack"])
    return max((float(np.mean([r["ssim"] for r in v])) for v in by.values()), default=None)


def collect_dfl_dp(study_dir: Path) -> list[dict]:
    out = []
    for run, s in _runs(study_dir):
        if s.get("data_part", "target") != "target":
            continue
        acc = s.get("accounting") or {}
        cond = "No-DP" if not s["dp"] else f"C={s['clip_norm']:g}, eps_cal={s['eps_cal']:g}"
        rec = {"condition": f"{s['framework']}: {cond}", "seed": s["seed"], "utility": 100 * s["final_acc"],
               "eps": acc.get("eps_total") if s["dp"] else math.inf, "delta": acc.get("delta_total"),
               "audited_eps": audited_epsilon(run), "_config": _json(run / "config.json")}
        if is_audited_run(run, s):
            out.append(_audited(rec))
            continue
        views = {f.stem.removeprefix("attacks_inversion_"): _rows(read_json(f))
                 for f in sorted(run.glob("attacks_inversion_*.json"))}
        out.append({**rec, **_mia(_rows(_json(run / "attacks_mia.json")) + _rows(_json(run / "attacks_lira.json"))),
                    "ssim": _ssim(views.get("noised-update") or views.get("gradient") or [])})
    return out


def _audited(rec: dict) -> dict:
    """An audited run's record: its own condition (canaries change utility) and no attack numbers."""
    return {**rec, "condition": rec["condition"] + AUDITED_TAG, "attack_skipped": AUDITED}


def collect_tabular_pdp(study_dir: Path) -> list[dict]:
    out = []
    # The sweep's raw-data twins (--attacks) live in raw-data/tabular-pdp/runs beside the study's own runs.
    for run, s in _runs(study_dir) + _runs(study_dir / "raw-data" / "tabular-pdp"):
        attacks = _rows(_json(run / "attacks.json"))
        anon = "raw" if not any(s.get("levels") or []) else "anonymized"
        audited = is_audited_run(run, s)
        for setting, v in (s.get("settings") or {}).items():
            rec = {"condition": f"{setting} ({anon})", "seed": s["seed"], "utility": v["final_mae"],
                   "eps": v.get("eps_rdp_max") if setting != "vanilla" else math.inf,
                   "delta": v.get("delta"), "audited_eps": audited_epsilon(run, setting),
                   "_config": _json(run / "config.json")}
            if tabular_setting_audited(setting, v, audited):
                out.append(_audited(rec))
                continue
            mine = [r for r in attacks if r.get("setting") == setting]
            attr = [r for r in mine if r.get("attack") == "attribute-inference" and "member_accuracy" in r]
            out.append({**rec, **_mia(mine),
                        "attribute_adv": max((r["advantage_over_baseline"] for r in attr), default=None)})
    return out


def tabular_setting_audited(setting: str, setting_summary: dict, run_audited: bool) -> bool:
    """Whether canary clients shared the aggregate of this tabular-pdp setting.

    The audit measures GDP / PDP only: the vanilla model of an audited run trains without canaries
    (the server app builds no audit for it), so it stays a valid target; a DP setting of an audited
    run, or any setting whose summary carries an audit, is not.
    """
    return bool(setting_summary.get("audit")) or (run_audited and setting != "vanilla")


def collect_ultrasound(study_dir: Path) -> list[dict]:
    out = []
    for run, s in _runs(study_dir):
        acc = s.get("accounting") or {}
        dp = f"DP-SGD C={s['max_grad_norm']:g} z={s['noise_multiplier']:g}" if s.get("dp_sgd") else "No-DP"
        rec = {"condition": f"{s['method']} {s['arch']} {s['task']} {s['partition']}: {dp}", "seed": s["seed"],
               "utility": 100 * s["test_accuracy"], "eps": acc.get("eps_rdp_max") if s.get("dp_sgd") else math.inf,
               "delta": acc.get("delta"), "audited_eps": audited_epsilon(run), "_config": _json(run / "config.json")}
        if is_audited_run(run, s):
            out.append(_audited(rec))
            continue
        inv = _rows(_json(run / "attacks_inversion.json"))
        view = "dp-sgd" if s.get("dp_sgd") else "gradient"
        out.append({**rec, **_mia(_rows(_json(run / "attacks_mia.json"))),
                    "ssim": _ssim([r for r in inv if r.get("view") == view])})
    return out


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
    for run, s in _runs(study_dir):
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
                if (rec["condition"], rec["seed"]) not in seen and not seen.add((rec["condition"], rec["seed"]))]
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


COLLECTORS: dict[str, Callable[[Path], list[dict]]] = {
    "dfl-dp": collect_dfl_dp, "tabular-pdp": collect_tabular_pdp, "ultrasound": collect_ultrasound,
    "unlinkable-dfl": collect_unlinkable_dfl,
}
UTILITY = {"dfl-dp": "test accuracy (%)", "tabular-pdp": "test MAE (lower is better)",
           "ultrasound": "test accuracy (%)", "unlinkable-dfl": "test accuracy (%)"}


def _eps_cell(values: list) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return NOT_RUN
    if all(math.isinf(v) for v in vals):
        return "inf (no DP)"
    return seed_cell(vals, 3) if len(set(vals)) > 1 else f"{vals[0]:.4g}"


def _cell(records: list[dict], key: str, digits: int = 3) -> str:
    vals = [r.get(key) for r in records]
    if all(v is None for v in vals):
        return _absent(records)
    return seed_cell([v for v in vals if v is not None], digits)


def _absent(records: list[dict]) -> str:
    """The cell of an attack that has no number: skipped (and why) or not run."""
    return next((r["attack_skipped"] for r in records if r.get("attack_skipped")), NOT_RUN)


# Config fields that do not make another condition: the seed (grouped over), where results go, and
# transport or implementation settings with the same mathematics.
NOT_CONDITION = frozenset({
    "seed", "results_dir", "run_name", "device", "round_timeout", "noise_seed_file", "noise_mode", "grad_sample_mode",
    "capture_victims", "clients_per_message", "num_supernodes", "audit_canaries", "audit_canary", "data_part",
    "node_local_data", "eval_data_path"})


def split_mixed_conditions(records: list[dict]) -> list[dict]:
    """Records whose condition label covers runs of different configs get the differing keys appended.

    A collector's label names the condition as the study's tables do (framework and DP point, say),
    not every key: runs of two grids, or a sweep rerun with ``--set lr=...``, in one results folder
    would otherwise be averaged as if they were seeds of one condition. Records keep their label when
    all runs under it share one config (up to :data:`NOT_CONDITION`); otherwise each gets
    `` [key=value, ...]`` of the keys that differ within its label. Records without a config are kept.
    """
    def variant(r: dict) -> tuple:
        cfg = r.get("_config") or {}
        return tuple(sorted((k, repr(v)) for k, v in cfg.items() if k not in NOT_CONDITION))

    out = [{k: v for k, v in r.items() if k != "_config"} for r in records]
    for cond, idx in group_by(range(len(records)), lambda i: records[i]["condition"]).items():
        variants = {variant(records[i]) for i in idx if records[i].get("_config")}
        if len(variants) < 2:
            continue
        keys = sorted({k for v in variants for k, _ in v if len({dict(w).get(k) for w in variants}) > 1})
        for i in idx:
            cfg = records[i].get("_config")
            if cfg:
                out[i]["condition"] = f"{cond} [" + ", ".join(f"{k}={cfg.get(k)}" for k in keys) + "]"
    return out


def build_card(study: str, records: list[dict]) -> list[dict]:
    """One row per condition; columns depend on what the study measures."""
    if study not in COLLECTORS:
        raise ValueError(f"study must be one of {list(COLLECTORS)}, got {study!r}")
    records = split_mixed_conditions(records)
    rows = []
    for cond, recs in group_by(records, lambda r: r["condition"]).items():
        util = [r["utility"] for r in recs if r.get("utility") is not None]
        deltas = sorted({r["delta"] for r in recs if r.get("delta") is not None})
        parts = group_by(recs, lambda r: r.get("part", ""))
        seeds = (" + ".join(f"{len(parts[p])} {p}" for p in sorted(parts)) if len(parts) > 1 else len(recs))
        row = {"condition": cond, "seeds": seeds,
               UTILITY[study]: seed_cell(util, 3 if study == "tabular-pdp" else 2) if util else "-",
               "formal eps": _eps_cell([r.get("eps") for r in recs]),
               "delta": ", ".join(f"{d:g}" for d in deltas) or "-",
               "audited eps (lower bound)": _cell(recs, "audited_eps"),
               "MIA AUC (best attack)": _cell(recs, "mia_auc"),
               "MIA TPR@FPR=0.1%": _cell(recs, "mia_tpr_0.001", 4),
               "best MIA attack": ", ".join(sorted({r["mia_attack"] for r in recs if r.get("mia_attack")}))
               or _absent(recs)}
        if study in ("dfl-dp", "ultrasound"):
            row["inversion SSIM (best attack)"] = _cell(recs, "ssim")
        if study == "tabular-pdp":
            row["attribute inference adv. over prior"] = _cell(recs, "attribute_adv")
        if study == "unlinkable-dfl":
            row["linking advantage"] = _cell(recs, "linking_adv")
            row["H_relay (bits)"] = _cell(recs, "h_relay", 2)
            row["H_path (bits)"] = _cell(recs, "h_path", 2)
            # without a mixnet there is no relay location to hide: not applicable, not "not run"
            row["H_relay^loc (bits)"] = "-" if all(r.get("no_mixnet") for r in recs) else _cell(recs, "h_relay_loc", 2)
        row["_records"] = recs
        rows.append(row)
    # A plain condition's audited epsilon comes from its audited twin (the same condition trained with
    # canaries, e.g. a second sweep with --audit into the same results dir): canaries change the model
    # that the attacks need, so the two numbers cannot come from one run. Only a twin with the same
    # formal epsilon counts (a label alone does not pin the noise, e.g. tabular-pdp's n_eps).
    by_cond = {r["condition"]: r for r in rows}
    for row in rows:
        twin = by_cond.get(row["condition"] + AUDITED_TAG)
        if (twin is not None and row["audited eps (lower bound)"] == NOT_RUN
                and twin["formal eps"] == row["formal eps"]):
            row["audited eps (lower bound)"] = twin["audited eps (lower bound)"] + TWIN_NOTE
    # No-DP conditions first (the reference), then by name, as the studies' own tables.
    no_dp = lambda r: all(math.isinf(x.get("eps") or 0) for x in r["_records"])  # noqa: E731
    return sorted(rows, key=lambda r: (not no_dp(r), r["condition"]))


def _mean(recs: list[dict], key: str) -> float:
    v = [r[key] for r in recs if r.get(key) is not None and math.isfinite(r[key])]
    return float(np.mean(v)) if v else math.nan


def card_figure(study: str, rows: list[dict], path: Path) -> bool:
    """Utility vs formal epsilon (no-DP drawn at the right edge), empirical privacy beside it."""
    pts = [(r["condition"], _mean(r["_records"], "eps"), _mean(r["_records"], "utility"),
            _mean(r["_records"], "mia_auc"), _mean(r["_records"], "audited_eps"),
            any(math.isinf(x.get("eps") or 0) for x in r["_records"])) for r in rows]
    pts = [p for p in pts if not math.isnan(p[2])]
    if not pts:
        return False
    finite = [p[1] for p in pts if not p[5] and math.isfinite(p[1])]
    inf_x = (max(finite) * 3 if finite else 1.0)
    fig, axes = subplots(1, 2, figsize=(11, 3.8), squeeze=False, sharex=True)
    left, right = axes[0]
    audit_ax = None
    for cond, eps, util, auc, aud, nodp in pts:
        x = inf_x if nodp else eps
        left.scatter([x], [util], label=cond, marker="s" if nodp else "o")
        if not math.isnan(auc):
            right.scatter([x], [auc], color="tab:red", marker="s" if nodp else "o")
        if not math.isnan(aud):
            audit_ax = audit_ax or right.twinx()
            audit_ax.scatter([x], [aud], color="tab:purple", marker="^")
    left.set_xscale("log")
    for ax in (left, right):
        ax.set_xlabel("formal epsilon (square = no DP, drawn at the right edge)")
    left.set_ylabel(UTILITY[study])
    left.set_title(f"{study}: utility vs formal epsilon", fontsize=9)
    left.legend(fontsize=5, loc="best")
    right.axhline(0.5, color="k", lw=0.8, ls=":")
    right.set_ylim(0.0, 1.0)
    right.set_ylabel("MIA ROC-AUC, strongest attack (red)")
    if audit_ax is not None:
        audit_ax.set_ylabel("audited epsilon, lower bound (purple)")
    if all(math.isnan(p[3]) and math.isnan(p[4]) for p in pts):
        right.text(0.5, 0.6, "no attack or audit results yet", ha="center", transform=right.transAxes, fontsize=8)
    right.set_title("empirical privacy", fontsize=9)
    save_fig(fig, path)
    return True


def write_card(study: str, study_dir: str | Path, out_dir: str | Path | None = None) -> str:
    """Collect one study's finished runs, write ``report_card.{csv,md,png}``; return the Markdown."""
    study_dir = Path(study_dir)
    out = Path(out_dir) if out_dir is not None else study_dir
    records = COLLECTORS[study](study_dir) if study in COLLECTORS else None
    if records is None:
        raise ValueError(f"study must be one of {list(COLLECTORS)}, got {study!r}")
    if not records:
        raise FileNotFoundError(f"no finished runs under {study_dir} (runs/*/summary.json)")
    rows = build_card(study, records)
    drew = card_figure(study, rows, out / "report_card.png")
    note = ("Cells over seeds: mean +- SD [95% t-interval]. MIA: the largest AUC (and, separately, the largest "
            "TPR at FPR 0.1%) over the attacks run (shadow models, loss threshold, offline LiRA); members = training "
            "data, non-members = held-out data. A maximum over several attacks sits slightly above 0.5 even without "
            "leakage; with fewer than 1,000 non-members FPR 0.1% means zero false positives. "
            "Audited eps: one-run lower bound from audit.json. Rows marked [audited] trained with audit canaries, "
            "which change the released model, so no attack is run on them (\"skipped: audited run\"); a plain "
            "row whose condition also has an [audited] row with the same formal eps shows that row's bound, marked "
            "\"(audited twin)\".")
    md = write_table(rows, out / "report_card", f"Privacy report card: {study}", note)
    return md + ("\n![report card](report_card.png)\n" if drew else "")
