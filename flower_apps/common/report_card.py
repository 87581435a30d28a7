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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_apps.common.plots import save_fig, subplots
from flower_apps.common.results import read_json
from flower_apps.common.tables import group_by, seed_cell, write_table

NOT_RUN = "not run"
AUDITED = "skipped: audited run"
AUDITED_TAG = " [audited]"
TWIN_NOTE = " (audited twin)"


#: A column of the card beside the common ones: (header, cell of a condition's records).
Column = tuple[str, Callable[[list[dict]], str]]


@dataclass(frozen=True)
class CardSpec:
    """What one study's report card needs: a collector and how to show what it collects.

    ``collect(study_dir)`` returns one record per finished run (or per run and part): ``condition``,
    ``seed``, ``utility``, ``eps`` (``math.inf`` without DP), ``delta``, ``audited_eps`` and any of
    ``mia_auc`` / ``mia_tpr_0.001`` / ``mia_attack`` (:func:`strongest_mia`), ``attack_skipped``, and the
    keys its ``columns`` read; ``_config`` (the run's config.json) separates conditions a label merges.
    A study registers its card in its StudySpec (``card.py`` of a built-in study, flower_apps.studies).
    """

    study: str
    collect: Callable[[Path], list[dict]]
    utility: str = "test accuracy (%)"
    utility_digits: int = 2
    columns: tuple[Column, ...] = ()


def column(header: str, key: str, digits: int = 3) -> Column:
    """A card column of the records' ``key`` over seeds (mean +- SD [t-interval]), or why it is empty."""
    return header, lambda recs: cell(recs, key, digits)


def summary_card(study: str, utility_key: str = "final_acc", scale: float = 100.0, eps_key: str = "eps",
                 delta_key: str = "delta", condition: Callable[[dict], str] | None = None,
                 utility: str = "test accuracy (%)") -> CardSpec:
    """A card for a study whose ``summary.json`` holds its utility and epsilon at the top level.

    ``condition(config)`` labels a run (default: the study's ``<results-dir>/<study>/runs`` name without
    its ``_s<seed>`` suffix); membership attack rows are read from ``attacks_mia.json`` when present and the
    audited epsilon from ``audit.json``.
    """
    def label(run: Path, cfg: dict) -> str:
        if condition is not None:
            return condition(cfg)
        name = run.name
        return name.rsplit("_s", 1)[0] if name.rsplit("_s", 1)[-1].isdigit() else name

    def collect(study_dir: Path) -> list[dict]:
        out = []
        for run, s in finished_runs(study_dir):
            cfg = optional_json(run / "config.json") or {}
            eps = s.get(eps_key)
            rec = {"condition": label(run, cfg), "seed": s.get("seed", cfg.get("seed")),
                   "utility": None if s.get(utility_key) is None else scale * float(s[utility_key]),
                   "eps": math.inf if eps is None else float(eps), "delta": s.get(delta_key),
                   "audited_eps": audited_epsilon(run), "_config": cfg or None}
            if is_audited_run(run, s):
                out.append(audited_record(rec))
                continue
            out.append({**rec, **strongest_mia(attack_rows(optional_json(run / "attacks_mia.json")))})
        return out

    return CardSpec(study, collect, utility)


def finished_runs(study_dir: Path) -> list[tuple[Path, dict]]:
    """(run folder, its summary) of every finished run under ``<study_dir>/runs``, by name."""
    out = []
    for run in sorted((study_dir / "runs").glob("*/")):
        if (run / "summary.json").is_file():
            out.append((run, read_json(run / "summary.json")))
    return out


def optional_json(path: Path):
    """The JSON at ``path``, or None when there is no such file."""
    return read_json(path) if path.is_file() else None


def attack_rows(obj) -> list[dict]:
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
    config = optional_json(run / "config.json") or {}
    if int(config.get("audit_canaries") or 0) > 0 or (run / "audit.json").is_file():
        return True
    summary = summary if summary is not None else (optional_json(run / "summary.json") or {})
    return bool(summary.get("audit"))


def audited_epsilon(run: Path, part: str | None = None) -> float | None:
    """Largest ``eps_lower`` in ``audit.json`` (the strongest audited threat model); None when absent.

    ``part``: a top-level key of ``audit.json`` to restrict to (a tabular setting), when present.
    """
    audit = optional_json(run / "audit.json")
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


def strongest_mia(rows: Iterable[dict]) -> dict:
    """Strongest membership attack of one run: the max AUC and the max TPR at FPR 0.1 % over attacks."""
    rows = [r for r in rows if "auc" in r]
    if not rows:
        return {}
    best = max(rows, key=lambda r: r["auc"])
    name = best.get("attack") or f"{best.get('feature')}/{best.get('classifier')}"
    return {"mia_auc": float(best["auc"]), "mia_attack": name,
            # None: too few non-members to measure that FPR (attacks.membership.runners)
            "mia_tpr_0.001": max((float(r["tpr_at_fpr_0.001"]) for r in rows
                                  if r.get("tpr_at_fpr_0.001") is not None), default=None)}


def best_ssim(rows: Iterable[dict]) -> float | None:
    """Best attack's mean SSIM over the attacked images (a run's inversion result)."""
    by = group_by([r for r in rows if "ssim" in r], lambda r: r["attack"])
    return max((float(np.mean([r["ssim"] for r in v])) for v in by.values()), default=None)


def audited_record(rec: dict) -> dict:
    """An audited run's record: its own condition (canaries change utility) and no attack numbers."""
    return {**rec, "condition": rec["condition"] + AUDITED_TAG, "attack_skipped": AUDITED}


def _eps_cell(values: list) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return NOT_RUN
    if all(math.isinf(v) for v in vals):
        return "inf (no DP)"
    return seed_cell(vals, 3) if len(set(vals)) > 1 else f"{vals[0]:.4g}"


def cell(records: list[dict], key: str, digits: int = 3) -> str:
    """A cell of the records' ``key`` over seeds (mean +- SD [t-interval]), or why it is empty."""
    vals = [r.get(key) for r in records]
    if all(v is None for v in vals):
        return _absent(records)
    return seed_cell([v for v in vals if v is not None], digits)


def _absent(records: list[dict]) -> str:
    """The cell of an attack that has no number: skipped (and why) or not run."""
    return next((r["attack_skipped"] for r in records if r.get("attack_skipped")), NOT_RUN)


# The key roles (flower_apps/config.py: ROLES) whose keys do not make another condition: the seed (grouped
# over), where results, data and computation are, transport, the noise's source, attack and audit probes.
CONDITION_FREE_ROLES = ("replicate", "location", "transport", "randomness", "probe")
# A field of older run folders' config.json that no key fills any more.
_OLD_FIELDS = frozenset({"num_supernodes"})


def condition_free_fields() -> frozenset[str]:
    """Config fields that do not make another condition: those of every registered study's keys with a
    role in :data:`CONDITION_FREE_ROLES`."""
    from flower_apps.studies import STUDIES

    return _OLD_FIELDS | {key.field for spec in STUDIES.values() for key in spec.keys.keys.values()
                          if key.roles & set(CONDITION_FREE_ROLES)}


def split_mixed_conditions(records: list[dict]) -> list[dict]:
    """Records whose condition label covers runs of different configs get the differing keys appended.

    A collector's label names the condition as the study's tables do (framework and DP point, say),
    not every key: runs of two grids, or a sweep rerun with ``--set lr=...``, in one results folder
    would otherwise be averaged as if they were seeds of one condition. Records keep their label when
    all runs under it share one config (up to :func:`condition_free_fields`); otherwise each gets
    `` [key=value, ...]`` of the keys that differ within its label. Records without a config are kept.
    """
    free = condition_free_fields()

    def variant(r: dict) -> tuple:
        cfg = r.get("_config") or {}
        return tuple(sorted((k, repr(v)) for k, v in cfg.items() if k not in free))

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


def build_card(card: CardSpec, records: list[dict]) -> list[dict]:
    """One row per condition: the common columns, then the study's own (``card.columns``)."""
    if not isinstance(card, CardSpec):
        raise TypeError(f"build_card wants a CardSpec (flower_apps.studies.STUDIES[name].card), got {card!r}")
    records = split_mixed_conditions(records)
    rows = []
    for cond, recs in group_by(records, lambda r: r["condition"]).items():
        util = [r["utility"] for r in recs if r.get("utility") is not None]
        deltas = sorted({r["delta"] for r in recs if r.get("delta") is not None})
        parts = group_by(recs, lambda r: r.get("part", ""))
        seeds = (" + ".join(f"{len(parts[p])} {p}" for p in sorted(parts)) if len(parts) > 1 else len(recs))
        row = {"condition": cond, "seeds": seeds,
               card.utility: seed_cell(util, card.utility_digits) if util else "-",
               "formal eps": _eps_cell([r.get("eps") for r in recs]),
               "delta": ", ".join(f"{d:g}" for d in deltas) or "-",
               "audited eps (lower bound)": cell(recs, "audited_eps"),
               "MIA AUC (best attack)": cell(recs, "mia_auc"),
               "MIA TPR@FPR=0.1%": cell(recs, "mia_tpr_0.001", 4),
               "best MIA attack": ", ".join(sorted({r["mia_attack"] for r in recs if r.get("mia_attack")}))
               or _absent(recs)}
        for header, make_cell in card.columns:
            row[header] = make_cell(recs)
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
    no_dp = lambda r: all(math.isinf(x.get("eps") or 0) for x in r["_records"])
    return sorted(rows, key=lambda r: (not no_dp(r), r["condition"]))


def _mean(recs: list[dict], key: str) -> float:
    v = [r[key] for r in recs if r.get(key) is not None and math.isfinite(r[key])]
    return float(np.mean(v)) if v else math.nan


def card_figure(card: CardSpec, rows: list[dict], path: Path) -> bool:
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
    left.set_ylabel(card.utility)
    left.set_title(f"{card.study}: utility vs formal epsilon", fontsize=9)
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


def write_card(card: CardSpec, study_dir: str | Path, out_dir: str | Path | None = None) -> str:
    """Collect one study's finished runs, write ``report_card.{csv,md,png}``; return the Markdown."""
    if not isinstance(card, CardSpec):
        raise TypeError(f"write_card wants a CardSpec (flower_apps.studies.STUDIES[name].card), got {card!r}")
    study_dir = Path(study_dir)
    out = Path(out_dir) if out_dir is not None else study_dir
    records = card.collect(study_dir)
    if not records:
        raise FileNotFoundError(f"no finished runs under {study_dir} (runs/*/summary.json)")
    rows = build_card(card, records)
    drew = card_figure(card, rows, out / "report_card.png")
    note = ("Cells over seeds: mean +- SD [95% t-interval]. MIA: the largest AUC (and, separately, the largest "
            "TPR at FPR 0.1%) over the attacks run (shadow models, loss threshold, offline LiRA); members = training "
            "data, non-members = held-out data. A maximum over several attacks sits slightly above 0.5 even without "
            "leakage; with fewer than 1,000 non-members FPR 0.1% means zero false positives. "
            "Audited eps: one-run lower bound from audit.json. Rows marked [audited] trained with audit canaries, "
            "which change the released model, so no attack is run on them (\"skipped: audited run\"); a plain "
            "row whose condition also has an [audited] row with the same formal eps shows that row's bound, marked "
            "\"(audited twin)\".")
    md = write_table(rows, out / "report_card", f"Privacy report card: {card.study}", note)
    return md + ("\n![report card](report_card.png)\n" if drew else "")
