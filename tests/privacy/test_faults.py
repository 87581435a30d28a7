"""The broken-mechanism switch (privacy/faults.py, run key dp-fault) is refused outside the audit's tests."""

from __future__ import annotations

import dataclasses

import pytest

from flower_apps.common.results import config_hash, run_hash
from flower_apps.config import ConfigError
from flower_apps.router import prepare
from privacy.faults import ALLOW_ENV, FAULTS, FAULTS_BY_STUDY, check_fault, noise_divisor


def test_a_fault_is_refused_unless_the_environment_allows_it(monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(ConfigError, match=f"^dp-fault: .*deliberately broken.*{ALLOW_ENV}=1"):
        prepare({"study": "dfl-dp", "preset": "smoke", "dp-fault": "noise-div-2"})
    monkeypatch.setenv(ALLOW_ENV, "1")
    _, cfg = prepare({"study": "dfl-dp", "preset": "smoke", "dp-fault": "noise-div-2"})
    assert cfg.dp_fault == "noise-div-2" and cfg.default_run_name.endswith("_FAULT-noise-div-2")


def test_each_study_takes_only_its_own_faults_and_only_with_dp(monkeypatch):
    monkeypatch.setenv(ALLOW_ENV, "1")
    with pytest.raises(ConfigError, match="not a fault of study 'ultrasound'"):
        prepare({"study": "ultrasound", "preset": "smoke", "dp-fault": "noise-div-2"})
    with pytest.raises(ConfigError, match="needs DP"):
        prepare({"study": "dfl-dp", "preset": "smoke", "dp": False, "dp-fault": "skip-clip"})
    with pytest.raises(ConfigError, match="allowed"):
        prepare({"study": "tabular-pdp", "preset": "smoke", "dp-fault": "noise-div-3"})
    assert set().union(*FAULTS_BY_STUDY.values()) == set(FAULTS)
    assert check_fault("") == "" and noise_divisor("noise-div-10") == 10 and noise_divisor("skip-clip") == 1


def test_the_correct_mechanism_keeps_the_run_identity_it_had_before_the_key_existed():
    _, cfg = prepare({"study": "dfl-dp", "preset": "smoke"})
    # client_fraction / client_sampling (issue 40) came later and stay out at full participation the same way
    before = {k: v for k, v in dataclasses.asdict(cfg).items()
              if k not in ("dp_fault", "round_timeout", "rerun", "results_dir", "run_name", "client_fraction",
                           "client_sampling")}
    assert run_hash(cfg) == config_hash(before)
