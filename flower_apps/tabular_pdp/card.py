"""tabular-pdp's privacy report card: MAE, formal and audited epsilon, MIA and attribute inference per setting."""

from __future__ import annotations

import math
from pathlib import Path

from flower_apps.common.report_card import (
    CardSpec,
    attack_rows,
    audited_epsilon,
    audited_record,
    column,
    finished_runs,
    is_audited_run,
    optional_json,
    strongest_mia,
)


def collect_tabular_pdp(study_dir: Path) -> list[dict]:
    out = []
    # The sweep's raw-data twins (--attacks) live in raw-data/tabular-pdp/runs beside the study's own runs.
    for run, s in finished_runs(study_dir) + finished_runs(study_dir / "raw-data" / "tabular-pdp"):
        attacks = attack_rows(optional_json(run / "attacks.json"))
        anon = "raw" if not any(s.get("levels") or []) else "anonymized"
        audited = is_audited_run(run, s)
        for setting, v in (s.get("settings") or {}).items():
            rec = {"condition": f"{setting} ({anon})", "seed": s["seed"], "utility": v["final_mae"],
                   "eps": v.get("eps_rdp_max") if setting != "vanilla" else math.inf,
                   "delta": v.get("delta"), "audited_eps": audited_epsilon(run, setting),
                   "_config": optional_json(run / "config.json")}
            if tabular_setting_audited(setting, v, audited):
                out.append(audited_record(rec))
                continue
            mine = [r for r in attacks if r.get("setting") == setting]
            attr = [r for r in mine if r.get("attack") == "attribute-inference" and "member_accuracy" in r]
            out.append({**rec, **strongest_mia(mine),
                        "attribute_adv": max((r["advantage_over_baseline"] for r in attr), default=None)})
    return out


def tabular_setting_audited(setting: str, setting_summary: dict, run_audited: bool) -> bool:
    """Whether canary clients shared the aggregate of this tabular-pdp setting.

    The audit measures GDP / PDP only: the vanilla model of an audited run trains without canaries
    (the server app builds no audit for it), so it stays a valid target; a DP setting of an audited
    run, or any setting whose summary carries an audit, is not.
    """
    return bool(setting_summary.get("audit")) or (run_audited and setting != "vanilla")


CARD = CardSpec("tabular-pdp", collect_tabular_pdp, "test MAE (lower is better)", utility_digits=3,
                columns=(column("attribute inference adv. over prior", "attribute_adv"),))
