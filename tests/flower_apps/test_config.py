import pytest

from flower_apps.config import RUN_CONFIG_DEFAULTS, ConfigError, pyproject_defaults
from flower_apps.router import prepare
from flower_apps.studies import STUDIES


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
])
def test_invalid_config_names_key_and_allowed_values(bad, key, allowed):
    with pytest.raises(ConfigError) as err:
        prepare(bad)
    assert key in str(err.value) and allowed in str(err.value)


def test_more_clients_than_samples_fails_before_training(tmp_path):
    from flower_apps.dfl_dp.data import build_data_plan, data_key

    _, cfg = prepare({"preset": "smoke", "num-clients": 5000, "results-dir": str(tmp_path)})
    with pytest.raises(ValueError, match="num-clients .* larger than"):
        build_data_plan(data_key(cfg))


def test_run_in_process_validates_before_starting_flower(tmp_path):
    from flower_apps.runner import run_config_in_process

    with pytest.raises(ConfigError, match="eps-cal"):
        run_config_in_process({"eps-cal": -2.0, "results-dir": str(tmp_path)})
    assert not any(tmp_path.iterdir())
