"""ultrasound's privacy report card: accuracy, formal and audited epsilon, MIA and inversion per condition."""

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


def collect_ultrasound(study_dir: Path) -> list[dict]:
    out = []
    for run, s in finished_runs(study_dir):
        acc = s.get("accounting") or {}
        dp = f"DP-SGD C={s['max_grad_norm']:g} z={s['noise_multiplier']:g}" if s.get("dp_sgd") else "No-DP"
        rec = {"condition": f"{s['method']} {s['arch']} {s['task']} {s['partition']}: {dp}", "seed": s["seed"],
               "utility": 100 * s["test_accuracy"], "eps": acc.get("eps_rdp_max") if s.get("dp_sgd") else math.inf,
               "delta": acc.get("delta"), "audited_eps": audited_epsilon(run), "_config": optional_json(run / "config.json")}
        if is_audited_run(run, s):
            out.append(audited_record(rec))
            continue
        inv = attack_rows(optional_json(run / "attacks_inversion.json"))
        view = "dp-sgd" if s.get("dp_sgd") else "gradient"
        out.append({**rec, **strongest_mia(attack_rows(optional_json(run / "attacks_mia.json"))),
                    "ssim": best_ssim([r for r in inv if r.get("view") == view])})
    return out


CARD = CardSpec("ultrasound", collect_ultrasound, columns=(column("inversion SSIM (best attack)", "ssim"),))
