"""tabular-pdp attacks: an overfit severity model leaks membership and an attribute; an untrained one does not."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from torch import nn

from flower_apps.tabular_pdp.attacks import (
    AttackSettings,
    attack_model,
    attack_run,
    build_target,
    model_path,
)
from flower_apps.tabular_pdp.config import config_for
from flower_apps.tabular_pdp.model import build_model

# Leave three risk factors out of the inputs: the severity is then noisy given the inputs, so a
# model can only fit the members' targets by memorizing them (as an over-trained client model would).
FEATURES = "Age,Year,Genetic_Risk,Smoking,Cancer_Type,Cancer_Stage"
LEVELS = (2, 1, 0, 0)
SMALL = AttackSettings(max_candidates=64, pool_rows=256, num_reference=3, reference_epochs=3,
                       attributes=("Smoking", "Gender"), attribute_candidates=11)


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    cfg = config_for("smoke", **{"tab-features": FEATURES, "num-clients": 3})
    return cfg, build_target(cfg, LEVELS, [0, 1, 2], SMALL)


def _overfit(t, steps: int = 1500) -> nn.Module:
    m = build_model(0, t.x_members.shape[1])
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    x, y = torch.from_numpy(t.x_members), torch.from_numpy(t.y_members)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    return m


def test_target_is_the_victims_rows_and_a_disjoint_pool(target):
    cfg, t = target
    assert t.victim == 0 and len(t.y_members) == len(t.y_nonmembers) == 64
    assert t.x_pool.shape == (256, len(t.features)) and "Gender" not in t.features  # Gender suppressed at level 1
    rows = {tuple(r) for r in np.round(np.c_[t.x_members, t.y_members], 5)}
    assert not rows & {tuple(r) for r in np.round(np.c_[t.x_pool, t.y_pool], 5)}


def test_overfit_model_leaks_membership_and_attribute(target):
    _, t = target
    rows = {r["attack"] + r.get("attribute", ""): r for r in attack_model(_overfit(t), t, SMALL)}
    assert rows["loss-threshold-shadow"]["auc"] > 0.75, rows
    assert rows["lira-offline"]["auc"] > 0.75, rows
    attr = rows["attribute-inferenceSmoking"]
    assert attr["member_accuracy"] > attr["baseline_accuracy"] + 0.1, attr
    assert rows["attribute-inferenceGender"]["skipped"] == "not a model input"
    assert all(r["levels"] == list(LEVELS) for r in rows.values())


def test_untrained_model_stays_near_chance(target):
    _, t = target
    rows = {r["attack"]: r for r in attack_model(build_model(1, t.x_members.shape[1]), t, SMALL)}
    for name in ("loss-threshold-shadow", "lira-offline"):
        assert abs(rows[name]["auc"] - 0.5) < 0.15, rows[name]


def test_attack_run_needs_the_saved_models(tmp_path, target):
    cfg, t = target
    with pytest.raises(FileNotFoundError, match="summary.json"):
        attack_run(tmp_path, cfg, SMALL)
    (tmp_path / "summary.json").write_text('{"settings": {"vanilla": {}}, "levels": [2, 1, 0, 0], '
                                           '"participants": [0, 1, 2]}')
    with pytest.raises(FileNotFoundError, match="final_model_vanilla.pt"):
        attack_run(tmp_path, cfg, SMALL)
    torch.save(_overfit(t, 300).state_dict(), model_path(tmp_path, "vanilla"))
    rows = attack_run(tmp_path, cfg, SMALL)
    assert {r["setting"] for r in rows} == {"vanilla"} and (tmp_path / "attacks.json").is_file()
    assert attack_run(tmp_path, cfg, SMALL) == rows  # cached


def test_audited_settings_are_skipped_and_vanilla_still_attacked(tmp_path, target):
    """Canary clients share the GDP / PDP aggregate of an audited run: those models are no target."""
    _, t = target
    cfg = config_for("smoke", **{"tab-features": FEATURES, "num-clients": 3, "tab-audit-canaries": 4})
    (tmp_path / "summary.json").write_text('{"settings": {"vanilla": {}, "gdp": {"audit": {"eps_lower": 0.1}}}, '
                                           '"levels": [2, 1, 0, 0], "participants": [0, 1, 2]}')
    torch.save(_overfit(t, 300).state_dict(), model_path(tmp_path, "vanilla"))  # no gdp model: never loaded
    rows = attack_run(tmp_path, cfg, SMALL)
    assert [r for r in rows if r["setting"] == "gdp"] == [{"setting": "gdp", "seed": cfg.seed,
                                                           "skipped": "skipped: audited run"}]
    assert {r["attack"] for r in rows if r["setting"] == "vanilla"} >= {"loss-threshold-shadow", "lira-offline"}


def test_smoke_run_saves_final_models_the_attacks_load(tmp_path, fake_grid_cls):
    """server_main (in-process grid) -> final_model_<setting>.pt -> the adapter's model, attacks, report card.

    The reloaded model reproduces the run's own final test MAE (pooled over the participants' test
    rows), so the file is the released global model, not an earlier or a client's one.
    """
    from flower_apps.common.report_card import write_card
    from flower_apps.common.results import read_json
    from flower_apps.router import client_app
    from flower_apps.tabular_pdp.attacks import load_final_model, predict
    from flower_apps.tabular_pdp.card import CARD
    from flower_apps.tabular_pdp.data import client_data, data_key
    from flower_apps.tabular_pdp.model import SeverityMLP
    from flower_apps.tabular_pdp.server_app import run_dir, server_main

    torch.set_num_threads(1)
    cfg = config_for("smoke", **{"num-clients": 3, "num-rounds": 1, "local-epochs": 1, "tab-levels": "2,1,0,0",
                                 "results-dir": str(tmp_path)})
    s = server_main(fake_grid_cls(list(range(3)), lambda node, msg: client_app(msg, None)), cfg)
    folder = run_dir(cfg)
    assert sorted(p.name for p in folder.glob("final_model_*.pt")) == [f"final_model_{k}.pt" for k in
                                                                        ("gdp", "pdp", "vanilla")]
    n_in = len(s["model_inputs"])
    test = [client_data(data_key(cfg), c, tuple(s["levels"]), cfg.k, cfg.features, cfg.test_fraction, cfg.seed)
            for c in s["participants"]]
    x = np.concatenate([d.x_test.numpy() for d in test])
    y = np.concatenate([d.y_test.numpy() for d in test])
    maes = {}
    for setting, v in s["settings"].items():
        state = torch.load(model_path(folder, setting), map_location="cpu", weights_only=True)
        assert list(state) == list(SeverityMLP(n_in).state_dict())  # the keys the adapter's model has
        maes[setting] = float(np.mean(np.abs(predict(load_final_model(folder, setting, n_in), x) - y)))
        assert maes[setting] == pytest.approx(v["final_mae"], rel=1e-4), setting
    assert len(set(maes.values())) == 3  # three different released models
    tiny = AttackSettings(max_candidates=32, pool_rows=64, num_reference=2, reference_epochs=2)
    rows = attack_run(folder, cfg, tiny)
    assert {(r["setting"], r["attack"]) for r in rows if "auc" in r} == {
        (k, a) for k in ("vanilla", "gdp", "pdp") for a in ("loss-threshold-shadow", "lira-offline")}
    write_card(CARD, tmp_path / "tabular-pdp")
    with open(tmp_path / "tabular-pdp" / "report_card.csv", newline="") as fh:
        card = {r["condition"]: r for r in csv.DictReader(fh)}
    assert sorted(card) == ["gdp (anonymized)", "pdp (anonymized)", "vanilla (anonymized)"]
    for _setting, row in card.items():  # every attack cell filled from attacks.json
        assert row["MIA AUC (best attack)"] != "not run" and row["attribute inference adv. over prior"] != "not run"
    assert read_json(folder / "attacks.json")["rows"] == rows
