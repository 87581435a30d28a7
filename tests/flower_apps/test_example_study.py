"""The minimal fifth study (flower_apps/example_minimal.py) runs through the router like any study.

It proves docs/architecture.md's "How to add a study": a study written only from the shared pieces
registers, validates its keys from one table, and runs through Flower's simulation path.
"""

from __future__ import annotations

import json

import pytest

from flower_apps import example_minimal
from flower_apps.config import ConfigError
from flower_apps.router import prepare
from flower_apps.studies import registered as registered_study


@pytest.fixture(scope="module")
def registered():
    """Register the example for this module only (the registries are process-wide)."""
    with registered_study(example_minimal.SPEC) as spec:
        yield spec


def test_keys_are_checked_from_the_one_table(registered):
    spec, cfg = prepare({"study": "example-minimal", "preset": "smoke"})
    assert spec is registered and cfg.num_clients == 4 and cfg.ex_eps_cal == 4.0
    with pytest.raises(ConfigError, match="ex-eps-cal"):
        prepare({"study": "example-minimal", "ex-eps-cal": -1.0})
    with pytest.raises(ConfigError, match="did you mean 'ex-clip-norm'"):
        prepare({"study": "example-minimal", "ex-clip-nrm": 1.0})


def test_the_example_study_runs_through_the_router_and_flower(registered, tmp_path):
    from flower_apps.runner import run_config_in_process

    secret = tmp_path / "noise.seed"
    secret.write_text("example")
    overrides = {"study": "example-minimal", "preset": "smoke", "results-dir": str(tmp_path / "r"),
                 "noise-seed-file": str(secret), "ex-eps-cal": 1000.0, "lr": 0.5}
    run_config_in_process(overrides, num_supernodes=2)
    (out,) = (tmp_path / "r" / "example-minimal" / "runs").iterdir()  # one folder, named by the run-name rule
    assert out.name == "smoke_ex-eps-cal1000.0_s0"
    summary = json.loads((out / "summary.json").read_text())
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["num_contributors"] == 4 and r["num_rejected"] == 0 for r in rounds)
    assert summary["noise_mode"] == "seeded" and summary["clip_unit"] == "client updates"
    # softmax regression learns the digits in two rounds when the noise is small (eps_cal = 1000)
    assert summary["final_acc"] > 0.6, rounds
    assert json.loads((out / "config.json").read_text())["ex_eps_cal"] == 1000.0
    # the run-folder rules of the built-in studies: a finished run of the same config is not rerun
    with pytest.raises(Exception, match="finished"):
        run_config_in_process(overrides, num_supernodes=2)
