"""dfl-dp's privacy report card: accuracy, formal and audited epsilon, MIA and inversion per condition."""

from __future__ import annotations

import math
from pathlib import Path

from flower_apps.common.report_card import (
    CardSpec,
    attack_rows,
    audited_epsilon,
    audited_record,
    best_ssim,
    column,
    finished_runs,
    is_audited_run,
    optional_json,
    strongest_mia,
)
from flower_apps.common.results import read_json


def collect_dfl_dp(study_dir: Path) -> list[dict]:
    out = []
    for run, s in finished_runs(study_dir):
        if s.get("data_part", "target") != "target":
            continue
        # A sampled run (client-fraction < 1) reports its sampled ledger's epsilon (amplified, privacy/accounting.py);
        # the full-participation row beside it in the summary is the seed paper's setting, not this run's.
        acc = s.get("accounting_sampled") or s.get("accounting") or {}
        cond = "No-DP" if not s["dp"] else f"C={s['clip_norm']:g}, eps_cal={s['eps_cal']:g}"
        if s.get("client_sampling"):
            cond += f", q={s['client_fraction']:g} ({s['client_sampling']} sampling)"
        rec = {"condition": f"{s['framework']}: {cond}", "seed": s["seed"], "utility": 100 * s["final_acc"],
               "eps": acc.get("eps_total") if s["dp"] else math.inf, "delta": acc.get("delta_total"),
               "audited_eps": audited_epsilon(run), "_config": optional_json(run / "config.json")}
        if is_audited_run(run, s):
            out.append(audited_record(rec))
            continue
        views = {f.stem.removeprefix("attacks_inversion_"): attack_rows(read_json(f))
                 for f in sorted(run.glob("attacks_inversion_*.json"))}
        out.append({**rec, **strongest_mia(attack_rows(optional_json(run / "attacks_mia.json"))
                                           + attack_rows(optional_json(run / "attacks_lira.json"))),
                    "ssim": best_ssim(views.get("noised-update") or views.get("gradient") or [])})
    return out


CARD = CardSpec("dfl-dp", collect_dfl_dp, columns=(column("inversion SSIM (best attack)", "ssim"),))
