"""One source per study's config: config classes derived from the key table, keys that carry their roles,
and the run identity computed one way (flower_apps/config.py, flower_apps/common/results.py:run_identity).

The kept run folders (results_protocol/, results_us_cpu/, results_audit/) are the reference: every one
must still be found under its folder name and config hash. The identity rules are also checked against
an independent copy of the rules the kept runs were written with (the hand lists and ultrasound's
``effective()`` they replace).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from flower_apps.common.results import run_hash, run_hashes, run_identity
from flower_apps.config import ROLES, ConfigError, Key, KeyTable, key_table_of, noise_condition
from flower_apps.router import prepare
from flower_apps.studies import BUILTIN_STUDIES, STUDIES

REPO = Path(__file__).resolve().parents[2]
KEPT = ("results_protocol", "results_us_cpu", "results_audit")


def _config_class(study: str) -> type:
    return type(prepare({"study": study, "preset": next(iter(STUDIES[study].presets))})[1])


def _kept_runs() -> list[Path]:
    return sorted(p.parent for root in KEPT for p in (REPO / root).rglob("runs/*/summary.json"))


def test_every_kept_run_folder_keeps_its_name_and_config_hash():
    runs = _kept_runs()
    assert {r.relative_to(REPO).parts[0] for r in runs} == set(KEPT) and len(runs) >= 170
    legacy = []
    for run in runs:
        study = run.parent.parent.name
        cfg = _config_class(study).from_json((run / "config.json").read_text())  # older folders lack newer keys
        kept = json.loads((run / "summary.json").read_text())["config_hash"]
        assert run.name == cfg.default_run_name, run
        assert kept in run_hashes(cfg), run
        if kept != run_hash(cfg):
            legacy.append(run.name)
    # three protocol runs predate 2026-12-01: their hash held the results folder (as written there) and run name
    assert len(legacy) == 3 and all(n.endswith("fashion-mnist_s0") for n in legacy), legacy


def _reference_identity(cfg) -> dict:
    """The rule the kept runs were written with (results.py's hand lists, ultrasound's effective())."""
    d = dataclasses.asdict(cfg)
    if type(cfg).__name__ != "UltrasoundConfig":
        d = {k: v for k, v in d.items() if k not in ("round_timeout", "rerun", "results_dir", "run_name")}
    else:
        for k in ("results_dir", "run_name", "rerun", "device", "grad_sample_mode", "channels_last", "round_timeout"):
            d.pop(k)
        if not cfg.dp_sgd:
            for k in ("noise_multiplier", "max_grad_norm", "delta", "dp_finetune"):
                d[k] = None
        if cfg.head_init == "timm":
            d.pop("head_init")
        if not cfg.dp_sgd or cfg.noise_mode == "secure":
            d.pop("noise_mode")
        if not cfg.audit_canaries:
            d.pop("audit_canaries")
            d.pop("audit_canary")
        if cfg.method != "fedprox":
            d["proximal_mu"] = None
        if cfg.method != "fedadam":
            d["server_lr"] = d["beta1"] = d["beta2"] = None
        if not cfg.node_local_data:
            d.pop("node_local_data")
            d.pop("eval_data_path")
    if d.get("dp_fault") == "":
        d.pop("dp_fault")
    if d.get("client_fraction") == 1.0:  # client sampling (issue 40): full participation keeps the older identity
        d.pop("client_fraction")
        d.pop("client_sampling")
    return d


@pytest.mark.parametrize("study", BUILTIN_STUDIES)
def test_the_identity_is_the_rule_the_kept_runs_carry(study):
    for preset in STUDIES[study].presets:
        cfg = prepare({"study": study, "preset": preset})[1]
        moved = dataclasses.replace(cfg, results_dir="/elsewhere", run_name="x", round_timeout=5.0, rerun="replace")
        assert run_identity(cfg) == _reference_identity(cfg) and run_hash(moved) == run_hash(cfg)
        older = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("round_timeout", "rerun")}
        if study != "ultrasound":  # before 2026-12-01 the hash held the results folder and run name
            if getattr(cfg, "dp_fault", None) == "":
                older.pop("dp_fault")
            if getattr(cfg, "client_fraction", None) == 1.0:
                older.pop("client_fraction")
                older.pop("client_sampling")
            assert run_identity(cfg, with_output=True) == older


def test_ultrasound_identity_follows_its_keys_conditions_in_every_setting():
    base = prepare({"study": "ultrasound", "preset": "smoke"})[1]
    for dp in (False, True):
        for mode, algorithm in (("federated", "fedavg"), ("federated", "fedprox"), ("federated", "fedadam"),
                                ("centralized", "fedprox"), ("local", "fedadam")):
            for head, noise, canaries, node in (("timm", "secure", 0, False), ("zero", "seeded", 8, False),
                                                ("timm", "seeded", 0, True)):
                cfg = dataclasses.replace(base, dp_sgd=dp, mode=mode, algorithm=algorithm, head_init=head,
                                          noise_mode=noise, audit_canaries=canaries, node_local_data=node,
                                          eval_data_path="/e" if node else "", device="cuda", channels_last=True)
                assert run_identity(cfg) == _reference_identity(cfg), (dp, mode, algorithm, head, noise, node)
    # a knob a run does not read is null, not its value
    assert run_hash(dataclasses.replace(base, proximal_mu=0.5)) == run_hash(base)  # fedavg does not read mu
    prox = dataclasses.replace(base, algorithm="fedprox")
    assert run_hash(dataclasses.replace(prox, proximal_mu=0.5)) != run_hash(prox)
    assert run_hash(dataclasses.replace(base, noise_multiplier=9.0)) == run_hash(base)  # smoke: no DP-SGD


def _table(*keys: Key) -> KeyTable:
    return KeyTable("roles-test", keys)


def test_hash_flags_leave_out_or_null_a_key_under_their_conditions():
    table = _table(Key("rt-on", False, bool, doc="switch"),
                   Key("rt-knob", 1.0, float, hash_null_when={"rt-on": (False,)}, doc="read only when on"),
                   Key("rt-new", "old", str, hash_omit_when={"rt-new": ("old",)}, doc="added after runs were kept"),
                   Key("rt-speed", 1, int, in_run_hash=False, doc="same mathematics"))
    cls = table.config_class("RolesRun")
    base = table.build(cls, {**table.defaults(), "rt-knob": 2.0})
    ident = run_identity(base)
    assert ident["rt_knob"] is None and "rt_new" not in ident and "rt_speed" not in ident
    assert "results_dir" not in ident and "run_name" not in ident and "rerun" not in ident
    on = dataclasses.replace(base, rt_on=True)
    assert run_identity(on)["rt_knob"] == 2.0 and run_hash(dataclasses.replace(on, rt_knob=3.0)) != run_hash(on)
    assert run_identity(dataclasses.replace(base, rt_new="new"))["rt_new"] == "new"
    assert run_hash(dataclasses.replace(base, rt_speed=9)) == run_hash(base)
    assert run_identity(base, with_output=True)["results_dir"] == "results"


def test_roles_and_conditions_are_checked_where_declared():
    with pytest.raises(ValueError, match=r"unknown roles \['place'\]"):
        Key("rt-x", 0, int, roles={"place"}, doc="x")
    with pytest.raises(ValueError, match=r"hash_null_when names keys \['rt-nope'\]"):
        _table(Key("rt-x", 0, int, hash_null_when={"rt-nope": (1,)}, doc="x"))
    with pytest.raises(ValueError, match="unknown role 'place'"):
        _table().with_role("place")
    assert set(ROLES) >= {"location", "output", "transport", "deployment"}


def test_a_config_not_derived_from_a_key_table_has_no_identity():
    @dataclasses.dataclass(frozen=True)
    class Bare:
        seed: int = 0

    with pytest.raises(TypeError, match="derive it with KEYS.config_class"):
        run_hash(Bare())
    with pytest.raises(TypeError, match="not a config class of a key table"):
        key_table_of(Bare())


def test_config_class_keeps_a_studys_properties_and_derives_every_field():
    from flower_apps.dfl_dp.config import DflDpConfig
    from flower_apps.dfl_dp.study import KEYS
    from flower_apps.tabular_pdp.config import TabularPdpConfig

    fields = {f.name: f for f in dataclasses.fields(DflDpConfig)}
    assert list(fields) == [k.field for k in KEYS.keys.values() if k.name != "study"]
    assert all(f.default == KEYS.keys[n].default_value() for n, f in zip(
        [k.name for k in KEYS.keys.values() if k.name != "study"], fields.values(), strict=True)
        if f.default is not dataclasses.MISSING)
    cfg = prepare({"study": "dfl-dp", "preset": "smoke", "attack-round": 0})[1]
    assert cfg.victim_round == cfg.num_rounds and cfg.condition == "C1_eps2" and DflDpConfig.from_json(cfg.to_json()) == cfg
    # tabular-pdp narrows dataset past the common default: that field has no default, the others do
    tab = {f.name: f for f in dataclasses.fields(TabularPdpConfig)}
    assert tab["dataset"].default is dataclasses.MISSING and tab["features"].default[:2] == ("Age", "Gender")
    tcfg = prepare({"study": "tabular-pdp", "preset": "smoke", "tab-levels": "2,1,0,0"})[1]
    assert TabularPdpConfig.from_json(tcfg.to_json()) == tcfg and tcfg.levels == (2, 1, 0, 0)

    class Named:
        @property
        def default_run_name(self) -> str:
            return "mine"

    table = _table(Key("rt-x", 0, int, doc="x"))
    with pytest.raises(ValueError, match="not both"):
        table.config_class("Both", base=Named, run_name=("rt-x",))
    with pytest.raises(TypeError, match="is a dataclass"):
        table.config_class("Fields", base=dataclasses.make_dataclass("WithFields", [("x", int)]))
    mine = table.config_class("MineRun", base=Named)
    assert table.build(mine, table.defaults()).default_run_name == "mine"


def test_derived_key_lists_come_from_the_roles():
    from flower_apps.common.report_card import condition_free_fields

    # what a seeded noise stream ignores: the location keys (a deployed run draws its simulation's noise)
    for study in BUILTIN_STUDIES:
        cfg = prepare({"study": study, "preset": "smoke"})[1]
        located = {k.field for k in key_table_of(cfg).with_role("location") if k.held}
        assert located <= {"results_dir", "run_name", "device", "noise_seed_file", "node_local_data", "eval_data_path"}
        assert {"device", "node_local_data"} <= located
        deployed = {"eval_data_path": "/coordinator/eval"} if "eval_data_path" in located else {}
        moved = dataclasses.replace(cfg, device="cuda:1", node_local_data=True, **deployed)
        assert noise_condition(moved) == noise_condition(cfg)
        assert noise_condition(dataclasses.replace(cfg, seed=cfg.seed + 1)) != noise_condition(cfg)
    # the report card's condition-free fields: the hand list it replaces, plus the memory layout (transport)
    assert condition_free_fields() >= {
        "seed", "results_dir", "run_name", "device", "round_timeout", "noise_seed_file", "noise_mode",
        "grad_sample_mode", "capture_victims", "clients_per_message", "num_supernodes", "audit_canaries",
        "audit_canary", "data_part", "node_local_data", "eval_data_path", "channels_last"}
    assert not condition_free_fields() & {"lr", "clip_norm", "eps_cal", "num_clients", "noise_multiplier", "rerun"}


def test_export_refuses_an_exporter_that_sets_a_key_that_is_not_a_deployment_key(tmp_path, monkeypatch):
    from deploy import export as ex

    monkeypatch.setitem(ex.EXPORTERS, "tabular-pdp", (lambda cfg, blocks, out: {"lr": 0.1}, False))
    with pytest.raises(RuntimeError, match=r"sets \['lr'\], which are not deployment keys"):
        ex.export("tabular-pdp", 2, 0, tmp_path, "smoke", {"num-clients": 3})
    assert {k.name for k in STUDIES["dfl-dp"].keys.with_role("deployment")} == {"node-local-data", "eval-data-path"}


def test_a_key_a_study_does_not_hold_is_checked_but_not_a_field():
    cfg = prepare({"study": "unlinkable-dfl", "preset": "smoke"})[1]
    assert not hasattr(cfg, "noise_seed_file")  # no DP noise in unlinkable-dfl
    with pytest.raises(ConfigError, match="noise-seed-file"):
        prepare({"study": "unlinkable-dfl", "preset": "smoke", "noise-seed-file": "/no/such/file"})
