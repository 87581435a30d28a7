import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from flower_apps.config import (
    COMMON_KEYS,
    DECLARED,
    RUN_CONFIG_DEFAULTS,
    ConfigError,
    Key,
    KeyTable,
    pyproject_defaults,
)
from flower_apps.router import prepare
from flower_apps.studies import STUDIES, register_study


def test_pyproject_holds_every_run_key_with_the_same_default():
    py = pyproject_defaults()
    missing = sorted(set(RUN_CONFIG_DEFAULTS) - set(py))
    extra = sorted(set(py) - set(RUN_CONFIG_DEFAULTS))
    assert not missing, f"add to [tool.flwr.app.config]: {missing}"
    assert not extra, f"keys in pyproject that no study reads: {extra}"
    diff = {k: (py[k], RUN_CONFIG_DEFAULTS[k]) for k in py if py[k] != RUN_CONFIG_DEFAULTS[k]}
    assert not diff, f"defaults differ (pyproject, code): {diff}"


def test_every_study_has_smoke_and_paper_presets_that_validate():
    for name, spec in STUDIES.items():
        assert {"smoke", "paper"} <= set(spec.presets), name
        for preset in spec.presets:
            prepare({"study": name, "preset": preset})


def test_issue_example_config_resolves_to_exactly_those_values():
    _, cfg = prepare({"study": "dfl-dp", "framework": "sequential-dfl", "clip-norm": 1.0, "eps-cal": 2.0,
                      "num-clients": 100, "num-rounds": 100, "seed": 0})
    assert (cfg.framework, cfg.clip_norm, cfg.eps_cal, cfg.num_clients, cfg.num_rounds) == \
        ("sequential-dfl", 1.0, 2.0, 100, 100)


def test_a_value_the_user_set_wins_over_the_preset_even_at_its_default():
    """Flower fuses pyproject's defaults into every run config, so `lr=0.01` (the key's default) looked
    unset and the ultrasound cpu preset's lr 1e-3 silently replaced it. The Run's override config and
    in-process overrides say what the user set."""
    from flower_apps.common.sweep import run_keys
    from flower_apps.router import prepare_run

    fused = {**RUN_CONFIG_DEFAULTS, "study": "ultrasound", "preset": "cpu"}  # what Flower hands the ServerApp
    assert RUN_CONFIG_DEFAULTS["lr"] == 0.01
    _, cfg = prepare_run(fused, {"study": "ultrasound", "preset": "cpu", "lr": 0.01})  # flwr run --run-config
    assert cfg.lr == 0.01
    _, cfg = prepare_run(fused, {"study": "ultrasound", "preset": "cpu"})  # not set: the preset's value
    assert cfg.lr == 1e-3
    _, cfg = prepare_run(fused, {}, {"study": "ultrasound", "preset": "cpu", "lr": 0.01})  # in-process
    assert cfg.lr == 0.01
    assert run_keys({"study": "ultrasound", "preset": "cpu", "lr": 0.01}, {})["lr"] == 0.01  # sweeps
    assert run_keys({"study": "ultrasound", "preset": "cpu"}, {"lr": 0.01})["lr"] == 0.01


def test_preset_applies_to_defaults_but_explicit_values_win():
    _, cfg = prepare({"preset": "smoke"})
    assert cfg.num_clients == 10 and cfg.num_rounds == 2 and cfg.dataset == "mnist-5k"
    _, cfg = prepare({"preset": "smoke", "num-rounds": 5})
    assert cfg.num_rounds == 5 and cfg.num_clients == 10


@pytest.mark.parametrize("bad,key,allowed", [
    ({"bogus-key": 1}, "bogus-key", "valid keys"),
    ({"eps-call": 1.0}, "eps-call", "did you mean 'eps-cal'"),
    ({"clip-norm": 0.0}, "clip-norm", "> 0"),
    ({"clip-norm": -1.0}, "clip-norm", "> 0"),
    ({"eps-cal": 0.0}, "eps-cal", "> 0"),
    ({"num-clients": 1}, "num-clients", ">= 2"),
    ({"framework": "gossip"}, "framework", "sequential-dfl"),
    ({"study": "nope"}, "study", "dfl-dp"),
    ({"preset": "huge"}, "preset", "smoke"),
    ({"dataset": "imagenet"}, "dataset", "fashion-mnist"),
    ({"device": "tpu"}, "device", "cpu"),
    ({"num-rounds": "ten"}, "num-rounds", "number"),
    ({"eps-cal": float("inf")}, "eps-cal", "finite"),
    ({"clip-norm": float("nan")}, "clip-norm", "finite"),
    ({"clip-norm": float("inf")}, "clip-norm", "finite"),
    ({"round-timeout": 0.0}, "round-timeout", "> 0"),
    ({"seed": -3}, "seed", ">= 0"),
    ({"noise-seed-file": "/nonexistent/noise.seed"}, "noise-seed-file", "does not exist"),
])
def test_invalid_config_names_key_and_allowed_values(bad, key, allowed):
    with pytest.raises(ConfigError) as err:
        prepare(bad)
    assert key in str(err.value) and allowed in str(err.value)


def test_more_clients_than_samples_fails_before_training(tmp_path):
    from datasets.image_plan import build_image_plan
    from flower_apps.dfl_dp.data import data_key

    _, cfg = prepare({"preset": "smoke", "num-clients": 5000, "results-dir": str(tmp_path)})
    with pytest.raises(ValueError, match=r"num_clients \(5000\) is larger than the target_train samples"):
        build_image_plan(data_key(cfg))


def test_run_in_process_validates_before_starting_flower(tmp_path):
    from flower_apps.runner import run_config_in_process

    with pytest.raises(ConfigError, match="eps-cal"):
        run_config_in_process({"eps-cal": -2.0, "results-dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="eps-cal must be a finite number"):
        run_config_in_process({"eps-cal": float("inf"), "results-dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="tab-noise-multiplier"):
        run_config_in_process({"study": "tabular-pdp", "tab-noise-multiplier": float("nan"),
                               "results-dir": str(tmp_path)})
    assert not any(tmp_path.iterdir())


# --- the one key table: everything below derives from the declarations -----------------------------

def _study_keys():
    return [(name, key) for name, spec in STUDIES.items() for key in spec.keys.keys.values()]


def _outside(key: Key):
    """A value just outside the key's declared range (None when it has none)."""
    step = 1 if key.type is int else 0.5
    for bound, bad in ((key.gt, key.gt), (key.ge, None if key.ge is None else key.ge - step),
                       (key.lt, key.lt), (key.le, None if key.le is None else key.le + step)):
        if bound is not None:
            return key.type(bad)
    return None


@pytest.mark.parametrize("study,key", [(s, k) for s, k in _study_keys() if _outside(k) is not None],
                         ids=lambda x: getattr(x, "name", x))
def test_every_ranged_key_refuses_a_value_outside_its_range_naming_key_and_range(study, key):
    with pytest.raises(ConfigError) as err:
        prepare({"study": study, "preset": "smoke", key.name: _outside(key)})
    assert str(err.value).startswith(key.name) and key.bounds() in str(err.value)


@pytest.mark.parametrize("study,key", [(s, k) for s, k in _study_keys() if k.choices is not None],
                         ids=lambda x: getattr(x, "name", x))
def test_every_key_with_choices_refuses_another_value_listing_the_allowed_ones(study, key):
    with pytest.raises(ConfigError) as err:
        prepare({"study": study, "preset": "smoke", key.name: "no-such-value"})
    assert str(err.value).startswith(key.name) and key.shown_choices()[0] in str(err.value)


@pytest.mark.parametrize("bad,expected", [
    ({"num-clients": 2.5}, "num-clients must be an integer >= 2, got 2.5"),
    ({"dp": "yes"}, "dp must be true or false, got 'yes'"),
    ({"run-name": 3}, "run-name must be a string, got 3"),
    ({"lr": float("nan")}, "lr must be a finite number, got nan"),
    ({"tab-k": float("inf")}, "tab-k must be a finite number"),  # another study's key: still no inf anywhere
    ({"device": "cuda:x"}, "device: got 'cuda:x'; allowed: 'auto', 'cpu', 'cuda', 'cuda:<i>'"),
    ({"capture-victims": 11, "preset": "smoke"}, "capture-victims: must be an integer in [0, num-clients]"),
])
def test_type_finite_and_cross_field_messages(bad, expected):
    with pytest.raises(ConfigError) as err:
        prepare(bad)
    assert expected in str(err.value)


def test_every_declared_default_passes_its_own_checks():
    for key in DECLARED.values():
        key.check(key.default)


def test_every_config_field_is_filled_by_exactly_one_key_of_its_study():
    for name, spec in STUDIES.items():
        _, cfg = prepare({"study": name, "preset": "smoke"})
        fields = [k.field for k in spec.keys.keys.values()]
        assert len(fields) == len(set(fields)), name
        assert {f.name for f in dataclasses.fields(cfg)} <= set(fields), name


def test_shared_keys_have_one_declaration_across_studies():
    for name, key in DECLARED.items():
        users = [s.keys.keys[name] for s in STUDIES.values() if name in s.keys]
        assert {k.declaration() for k in users} == {key.declaration()}, name


def test_register_study_refuses_conflicting_or_repeated_declarations():
    base = STUDIES["dfl-dp"]

    def spec(name, *keys):
        return dataclasses.replace(base, name=name, action=name.replace("-", "_"), keys=KeyTable(name, keys))

    with pytest.raises(ValueError, match="'lr' default 0.1 conflicts with 0.01"):
        register_study(spec("other", Key("lr", 0.1, float, gt=0, doc="client learning rate")))
    with pytest.raises(ValueError, match="declared again"):
        register_study(spec("other", Key("lr", 0.01, float, gt=0, doc="a second doc")))
    with pytest.raises(ValueError, match="redefines the common key 'num-rounds'"):
        KeyTable("other", [Key("num-rounds", 5, int, ge=1, doc="number of training rounds")])
    with pytest.raises(ValueError, match="declares key 'x' twice"):
        KeyTable("other", [Key("x", 1, int, doc="x"), Key("x", 1, int, doc="x")])
    with pytest.raises(ValueError, match="keeps"):
        COMMON_KEYS["num-clients"].refine(default=3)
    assert "other" not in STUDIES


def test_pyproject_block_and_docs_table_are_generated_from_the_declarations():
    from flower_apps.keys import render_markdown

    root = Path(__file__).resolve().parents[2]
    check = subprocess.run([sys.executable, str(root / "scripts" / "sync_run_keys.py"), "--check"],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    assert (root / "docs" / "run_keys.md").read_text() == render_markdown(), "run: python scripts/sync_run_keys.py"
    text = (root / "pyproject.toml").read_text()
    for key in DECLARED.values():  # each key's doc is a comment right above it
        assert f"{key.name} = " in text and key.doc[:40] in text, key.name
