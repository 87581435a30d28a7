"""Hostile run configs are refused before any work (issue 36).

Each case ran (or silently misbehaved) before: eps-cal=1e300 trained and failed in the accountant
after writing the model; run-name='/etc/x' wrote outside the results folder; a rerun replaced a
finished run; a data-dir the dataset never reads was ignored.
"""

from __future__ import annotations

import re

import pytest

from flower_apps.config import ConfigError
from flower_apps.router import prepare

# (study, preset, DP switch, the hostile key and value): each makes the study's accountant fail or its noise degenerate
UNACCOUNTABLE = [
    ("dfl-dp", "smoke", {}, "eps-cal", 1e300),  # z = 1e-300: the accountant divides by zero
    ("dfl-dp", "smoke", {}, "eps-cal", 1e-300),  # z = 1e300: overflow
    ("dfl-dp", "smoke", {}, "delta-total", 5e-324),  # epsilon is nan
    ("dfl-dp", "smoke", {}, "num-rounds", 10**100),  # the accountant divides by zero
    ("dfl-dp", "smoke", {}, "clip-norm", 1e-300),  # sigma_abs underflows to 0 in float32: no noise at all
    ("dfl-dp", "smoke", {"framework": "sequential-dfl"}, "eps-cal", 1e300),
    ("tabular-pdp", "smoke", {}, "tab-noise-multiplier", 1e-300),  # epsilon is inf
    ("tabular-pdp", "smoke", {}, "tab-noise-multiplier", 1e300),  # overflow
    ("tabular-pdp", "smoke", {"tab-clip-mode": "fixed"}, "tab-noise-multiplier", 1e38),  # sigma inf in float32
    ("ultrasound", "smoke", {"us-dp-sgd": True}, "us-noise-multiplier", 1e300),  # z C is inf in float32
    ("ultrasound", "smoke", {"us-dp-sgd": True}, "us-noise-multiplier", 1e-300),  # z C underflows to 0
]


@pytest.mark.parametrize("study,preset,extra,key,value", UNACCOUNTABLE,
                         ids=[f"{s}-{k}={v:g}{'-' + '-'.join(e) if e else ''}" for s, _, e, k, v in UNACCOUNTABLE])
def test_a_value_the_accountant_cannot_account_for_is_refused_with_its_working_range(study, preset, extra, key, value):
    raw = {"study": study, "preset": preset, **extra, key: value}
    with pytest.raises(ConfigError) as err:
        prepare(raw)
    msg = str(err.value)
    assert msg.startswith(f"{key}: ") and "\n" not in msg, msg  # one line, naming the key first
    m = re.search(rf"allowed with the other keys as given: {re.escape(key)} in \[(\S+), (\S+)\]", msg)
    assert m, msg
    lo, hi = (int(x) if isinstance(value, int) else float(x) for x in m.groups())
    assert not lo <= value <= hi
    # the range it states is true: both ends are accepted (the default lies inside)
    for bound in (lo, hi):
        prepare({**raw, key: bound})


@pytest.mark.parametrize("study,raw,key", [
    ("tabular-pdp", {"preset": "paper"}, "tab-noise-multiplier"),
    ("ultrasound", {"preset": "smoke", "us-dp-sgd": True}, "us-noise-multiplier"),
])
def test_no_noise_stays_legal_but_a_noise_too_small_to_account_for_is_refused(study, raw, key):
    prepare({"study": study, **raw, key: 0.0})  # no noise: legal, warned where it runs (epsilon infinite)
    with pytest.raises(ConfigError, match=f"^{key}: "):
        prepare({"study": study, **raw, key: 1e-300})


def test_refused_before_any_work(tmp_path, monkeypatch):
    import flower_apps.runner as runner

    monkeypatch.setattr(runner, "simulate", lambda *a, **k: pytest.fail("the simulation started"))
    with pytest.raises(ConfigError, match="eps-cal"):
        runner.run_config_in_process({"preset": "smoke", "eps-cal": 1e300, "results-dir": str(tmp_path)})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["/etc/x", "../x", "a/../../x", "..", ".", "a/b", "a\\b", "x\0y"])
@pytest.mark.parametrize("study", ["dfl-dp", "tabular-pdp", "ultrasound", "unlinkable-dfl"])
def test_a_run_name_that_leaves_the_runs_folder_is_refused(study, name, tmp_path):
    from flower_apps.common.results import run_folder

    with pytest.raises(ConfigError, match=r"^run-name: got .*one folder name inside <results-dir>/<study>/runs/"):
        prepare({"study": study, "preset": "smoke", "run-name": name})
    _, cfg = prepare({"study": study, "preset": "smoke", "run-name": "my-run.v2", "results-dir": str(tmp_path)})
    assert run_folder(study, cfg) == tmp_path / study / "runs" / "my-run.v2"  # a plain name stays inside


def _finished(tmp_path, **keys):
    from flower_apps.common.results import atomic_write_json, open_run_folder, run_folder, run_hash

    _, cfg = prepare({"study": "dfl-dp", "preset": "smoke", "results-dir": str(tmp_path), **keys})
    folder = run_folder("dfl-dp", cfg)
    open_run_folder(folder, cfg)
    atomic_write_json(folder / "summary.json", {"config_hash": run_hash(cfg), "final_acc": 0.9})
    return folder, cfg


def test_a_finished_run_is_kept_when_the_same_config_runs_again(tmp_path, monkeypatch):
    import flower_apps.runner as runner
    from flower_apps.common.results import RunFinished, close_run_folder, open_run_folder

    folder, cfg = _finished(tmp_path)
    close_run_folder(folder)
    kept = (folder / "summary.json").read_text()
    with pytest.raises(RunFinished, match=rf"run folder {re.escape(str(folder))} holds a finished run of this "
                                          r"config .* it is kept\. rerun: got 'refuse'; allowed: 'refuse', 'replace'"):
        open_run_folder(folder, cfg)
    # refused before the simulation starts, through the router's one-line path (a ConfigError)
    monkeypatch.setattr(runner, "simulate", lambda *a, **k: pytest.fail("the simulation started"))
    with pytest.raises(ConfigError, match="holds a finished run of this config"):
        runner.run_config_in_process({"preset": "smoke", "results-dir": str(tmp_path)})
    assert (folder / "summary.json").read_text() == kept
    # explicitly asked for: the folder is reopened to be replaced
    _, again = prepare({"study": "dfl-dp", "preset": "smoke", "results-dir": str(tmp_path), "rerun": "replace"})
    assert open_run_folder(folder, again) == folder
    close_run_folder(folder)
    # an unfinished run (crashed before its summary) still resumes in its folder, with the default rerun
    (folder / "summary.json").unlink()
    (folder / "rounds.jsonl").write_text('{"round": 1}\n')
    assert open_run_folder(folder, cfg) == folder
    assert (folder / "rounds.jsonl").read_text() == '{"round": 1}\n'
    close_run_folder(folder)


def test_the_rerun_key_is_not_part_of_a_runs_identity(tmp_path):
    from flower_apps.common.results import run_finished, run_hash

    folder, cfg = _finished(tmp_path)
    _, replace = prepare({"study": "dfl-dp", "preset": "smoke", "results-dir": str(tmp_path), "rerun": "replace"})
    assert run_hash(replace) == run_hash(cfg) and run_finished(folder, replace)  # sweeps still skip it


@pytest.mark.parametrize("study,raw", [
    ("dfl-dp", {"preset": "smoke", "dataset": "mnist-5k"}),
    ("unlinkable-dfl", {"preset": "smoke", "dataset": "mnist-5k"}),
    ("tabular-pdp", {"preset": "smoke", "dataset": "cancer-synthetic"}),
    ("ultrasound", {"preset": "smoke", "dataset": "synthetic"}),
])
def test_a_data_dir_the_dataset_does_not_read_is_refused(study, raw, tmp_path):
    with pytest.raises(ConfigError, match=rf"^data-dir: dataset '{raw['dataset']}' does not read data-dir, "
                                          r"got .*; allowed with dataset .*: '' \(the default\)$"):
        prepare({"study": study, **raw, "data-dir": str(tmp_path)})
    prepare({"study": study, **raw})  # without it: fine
    if study in ("dfl-dp", "unlinkable-dfl"):  # a dataset that reads files takes it
        _, cfg = prepare({"study": study, **raw, "dataset": "fashion-mnist", "data-dir": str(tmp_path)})
        assert cfg.data_dir == str(tmp_path)

