"""tabular-pdp config: presets, bad keys fail before any training, sweep grid and resume."""

import argparse

import pytest

from flower_apps.common.results import atomic_write_json, run_hash
from flower_apps.config import ConfigError


def test_paper_preset_is_the_papers_setup_and_registered_with_the_router():
    from flower_apps.router import prepare

    spec, cfg = prepare({"study": "tabular-pdp"})
    assert spec.action == "tabular_pdp" and cfg.preset == "paper"
    assert (cfg.num_clients, cfg.num_rounds, cfg.local_epochs, cfg.lr) == (10, 5, 100, 1e-3)
    assert (cfg.k, cfg.suppression, cfg.noise_multiplier, cfg.clip_quantile) == (5, 0.1, 0.05, 0.9)
    assert cfg.settings == ("vanilla", "gdp", "pdp") and cfg.test_fraction == 0.2 and cfg.dataset == "cancer-synthetic"
    _, smoke = prepare({"study": "tabular-pdp", "preset": "smoke", "num-rounds": 3})
    assert smoke.num_rounds == 3 and smoke.local_epochs == 2


@pytest.mark.parametrize("bad,key,allowed", [
    ({"tab-settings": "vanilla,dp"}, "tab-settings", "vanilla"),
    ({"tab-clip-mode": "auto"}, "tab-clip-mode", "estimate"),
    ({"num-clients": 2}, "tab-clip-mode", "num-clients >= 3"),  # the robust C estimate (estimate is the default)
    ({"tab-poison": "evil"}, "tab-poison", "flip-targets"),
    ({"num-clients": 11}, "num-clients", "at most 10"),
    ({"tab-poison-client": 10}, "tab-poison-client", "0..9"),
    ({"tab-k": 0}, "tab-k", ">= 1"),
    ({"tab-suppression": 1.5}, "tab-suppression", "[0, 1]"),
    ({"tab-features": "Age,Target_Severity_Score"}, "tab-features", "Cancer_Stage"),
    ({"tab-levels": "2,1,0,1"}, "tab-levels", "Cancer_Type 0..0"),
    ({"dataset": "imagenet"}, "dataset", "cancer-synthetic"),
    ({"dataset": "cancer-csv"}, "data-dir", "CSV"),
    ({"tab-noise-multiplier": -0.1}, "tab-noise-multiplier", ">= 0"),
    ({"tab-drift-min-ratio": 0.5}, "tab-drift-min-ratio", ">= 1"),
    ({"local-epochs": 0}, "local-epochs", ">= 1"),
])
def test_bad_config_names_the_key_and_the_allowed_values(bad, key, allowed):
    from flower_apps.router import prepare

    with pytest.raises(ConfigError) as err:
        prepare({"study": "tabular-pdp", "preset": "smoke", **bad})
    assert str(err.value).startswith(key) and allowed in str(err.value)


def test_bad_config_fails_before_the_simulation_starts():
    from flower_apps.runner import run_config_in_process

    with pytest.raises(ConfigError, match="tab-poison"):
        run_config_in_process({"study": "tabular-pdp", "preset": "smoke", "tab-poison": "evil"})


def _args(**kw):
    from flower_apps.tabular_pdp.sweep import parse_args

    return parse_args([f"--{k.replace('_', '-')}={v}" for k, v in kw.items()])


def test_sweep_grid_has_main_runs_then_one_poisoned_client_per_detection_run(tmp_path):
    from flower_apps.tabular_pdp.server_app import is_complete, run_dir
    from flower_apps.tabular_pdp.sweep import build_configs

    configs = build_configs(_args(results_dir=tmp_path))
    main, detect = configs[:3], configs[3:]
    assert [c.seed for c in main] == [0, 1, 2] and all(c.settings == ("vanilla", "gdp", "pdp") for c in main)
    assert all(c.local_epochs == 10 and c.num_rounds == 5 and c.poison == "none" for c in main)
    assert len(detect) == 15 and all(c.settings == () for c in detect)
    assert {(c.poison, c.seed, c.poison_client) for c in detect if c.seed == 3} == {
        ("shift-targets", 3, 3), ("flip-targets", 3, 3), ("scale-features", 3, 3)}
    assert len({c.default_run_name for c in configs}) == len(configs)
    # resume: a summary with the same config hash marks the run done, another config's does not
    atomic_write_json(run_dir(main[0]) / "summary.json", {"config_hash": run_hash(main[0])})
    assert is_complete(main[0]) and not is_complete(main[1])
    atomic_write_json(run_dir(main[1]) / "summary.json", {"config_hash": "stale"})
    assert not is_complete(main[1])
    assert isinstance(_args(epochs=3), argparse.Namespace)
    assert build_configs(_args(results_dir=tmp_path, epochs=3, drift_seeds=0))[0].local_epochs == 3
