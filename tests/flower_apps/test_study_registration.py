"""Registration in one place: a study's spec says how many SuperNodes it needs and which report card it has."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import pytest

from flower_apps.common.report_card import CardSpec, build_card, summary_card
from flower_apps.config import default_nodes
from flower_apps.router import prepare
from flower_apps.studies import STUDIES, register_study


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_every_builtin_study_has_a_card_of_its_own(study):
    card = STUDIES[study].card
    assert isinstance(card, CardSpec) and card.study == study


@pytest.mark.parametrize("study,preset,expected", [
    ("dfl-dp", "smoke", 2), ("tabular-pdp", "smoke", 10), ("unlinkable-dfl", "paper", 32),
    ("unlinkable-dfl", "reduced", 2)])
def test_nodes_needed_comes_from_the_study(study, preset, expected):
    spec, cfg = prepare({"study": study, "preset": preset})
    assert spec.nodes_needed(cfg) == expected


def test_a_config_without_num_clients_gets_no_guess():
    @dataclass(frozen=True)
    class NoClients:
        seed: int = 0

    with pytest.raises(ValueError, match="has no num_clients: give the study a nodes rule"):
        default_nodes(NoClients())
    spec = replace(STUDIES["dfl-dp"], nodes=lambda cfg: 0)
    with pytest.raises(ValueError, match="nodes rule gave 0 SuperNodes"):
        spec.nodes_needed(prepare({"study": "dfl-dp", "preset": "smoke"})[1])


def test_a_study_cannot_register_another_studys_card():
    spec = replace(STUDIES["dfl-dp"], name="copy", action="copy", card=STUDIES["tabular-pdp"].card)
    with pytest.raises(ValueError, match="registers the report card of 'tabular-pdp'"):
        register_study(spec)
    assert "copy" not in STUDIES


def test_summary_card_reads_top_level_utility_and_epsilon(tmp_path):
    for name, seed, acc, eps in (("dp_s0", 0, 0.8, 3.0), ("dp_s1", 1, 0.9, 3.0), ("nodp_s0", 0, 0.95, None)):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"seed": seed, "final_acc": acc, "eps": eps, "delta": 1e-5}))
        (run / "config.json").write_text(json.dumps({"seed": seed}))
    (tmp_path / "runs" / "dp_s1" / "attacks_mia.json").write_text(
        json.dumps([{"attack": "loss-threshold", "auc": 0.61, "tpr_at_fpr_0.001": 0.0}]))
    card = summary_card("mine")
    rows = {r["condition"]: r for r in build_card(card, card.collect(tmp_path))}
    assert sorted(rows) == ["dp", "nodp"]
    assert rows["nodp"]["formal eps"] == "inf (no DP)" and rows["dp"]["formal eps"] == "3"
    assert rows["dp"]["test accuracy (%)"].startswith("85.00 +- 7.07")
    assert rows["dp"]["MIA AUC (best attack)"].startswith("0.610") and rows["dp"]["seeds"] == 2
    assert math.isinf(card.collect(tmp_path)[-1]["eps"])


def test_config_class_is_derived_from_the_key_table():
    import dataclasses
    import pickle

    from flower_apps import example_minimal as ex
    from flower_apps.config import RUN_CONFIG_DEFAULTS, resolve
    from flower_apps.studies import registered

    global ExampleRun  # pickle finds a derived class where the caller binds it, under its name
    ExampleRun = ex.KEYS.config_class("ExampleRun", run_name=("ex-eps-cal", "lr"))
    with registered(ex.SPEC):
        _, flat = resolve({**RUN_CONFIG_DEFAULTS, "study": ex.STUDY, "preset": "smoke", "ex-eps-cal": 2.0}, STUDIES)
        cfg = ex.KEYS.build(ExampleRun, flat)
    names = [f.name for f in dataclasses.fields(cfg)]
    assert names == [k.field for k in ex.KEYS.keys.values() if k.name != "study"]
    assert cfg.ex_eps_cal == 2.0 and cfg.num_clients == 4 and cfg.default_run_name == "smoke_ex-eps-cal2.0_lr0.01_s0"
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 1
    with pytest.raises(ValueError, match=r"run_name keys \['nope'\] are not in its key table"):
        ex.KEYS.config_class("Bad", run_name=("nope",))


def test_run_record_refuses_a_finished_run_and_keeps_rounds(tmp_path):
    from flower_apps.common.results import RunFinished, read_json, read_jsonl
    from flower_apps.common.run_record import RunRecord
    from flower_apps.config import Key, KeyTable

    # a run record needs a config derived from a key table: its keys say what the run's identity holds
    table = KeyTable("mine", (Key("mine-lr", 0.1, float, gt=0, doc="learning rate"),))
    cfg = table.build(table.config_class("MineRun", run_name=("mine-lr",)),
                      {**table.defaults(), "results-dir": str(tmp_path), "preset": "r"})

    with pytest.raises(RuntimeError, match="boom"):
        with RunRecord("mine", cfg) as run:
            run.round({"round": 1, "acc": 0.5})
            raise RuntimeError("boom")
    folder = tmp_path / "mine" / "runs" / "r_mine-lr0.1_s0"
    assert read_jsonl(folder / "rounds.jsonl") == [{"round": 1, "acc": 0.5}] and not (folder / "summary.json").exists()
    with RunRecord("mine", cfg) as run:  # an unfinished run starts again
        summary = run.finish({"final_acc": 0.7})
    assert read_json(folder / "summary.json") == summary and summary["run"] == "r_mine-lr0.1_s0"
    assert summary["final_acc"] == 0.7
    with pytest.raises(RunFinished, match="holds a finished run of this config"):
        RunRecord("mine", cfg).__enter__()
