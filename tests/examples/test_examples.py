"""The three example studies of issue 38 run end to end through the router and Flower's simulation,
each in at most 150 lines, and appear in ``python -m flower_apps.report``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from flower_apps.common.results import read_json, read_jsonl
from flower_apps.report import write_page
from flower_apps.runner import run_config_in_process
from flower_apps.studies import registered

EXAMPLES = ("fedavg_dpsgd_mia", "fedprox_gdp_tabular", "seq_dfl_fashion")
HERE = Path(__file__).parent


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_is_at_most_150_lines(name):
    assert len((HERE / f"{name}.py").read_text().splitlines()) <= 150


def load(name: str):
    """The example module, loaded from its file (not importable by name: the simulation's workers get its
    ClientApp by value, as they would get a study that lives outside this repository)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(module, tmp_path: Path, **keys) -> tuple[dict, list[dict]]:
    with registered(module.SPEC):
        run_config_in_process({"study": module.STUDY, "preset": "smoke", "results-dir": str(tmp_path), **keys})
        page, done = write_page(tmp_path)
    assert module.STUDY in done and f"Privacy report card: {module.STUDY}" in page
    (run,) = (tmp_path / module.STUDY / "runs").iterdir()
    return read_json(run / "summary.json"), read_jsonl(run / "rounds.jsonl")


def test_sequential_dfl_on_fashion_mnist(tmp_path):
    ex = load("seq_dfl_fashion")
    summary, rounds = _run(ex, tmp_path)
    assert [r["round"] for r in rounds] == [1, 2] and summary["run"] == "smoke_dirichlet-alpha0.5_s0"
    assert summary["final_acc"] > 0.3, rounds  # 10 classes: the token learned along the chain
    assert json.loads((tmp_path / ex.STUDY / "runs" / summary["run"] / "config.json").read_text())["num_clients"] == 6


def test_fedavg_with_client_dp_sgd_at_a_target_epsilon_and_a_membership_attack(tmp_path):
    ex = load("fedavg_dpsgd_mia")
    summary, rounds = _run(ex, tmp_path)
    assert [r["round"] for r in rounds] == [1, 2] and summary["run"] == "smoke_exa-target-eps8.0_s0"
    assert 0 < summary["eps"] <= 8.0 and summary["delta"] == 1e-5  # calibrated to the target, never above it
    assert summary["final_acc"] > 0.2, rounds  # 10 classes; DP-SGD at eps 8 still learns
    (mia,) = read_json(tmp_path / ex.STUDY / "runs" / summary["run"] / "attacks_mia.json")
    assert mia["attack"] == "loss" and 0.0 <= mia["auc"] <= 1.0 and mia["n_members"] == mia["n_nonmembers"] > 100


def test_fedprox_with_server_side_gdp_on_the_tabular_data(tmp_path):
    from privacy.tabular_accounting import gaussian_epsilon

    ex = load("fedprox_gdp_tabular")
    summary, rounds = _run(ex, tmp_path)
    assert [r["round"] for r in rounds] == [1, 2, 3] and all(r["sigma"] == 1.0 * 0.5 / 10 for r in rounds)
    assert rounds[-1]["test_mae"] < rounds[0]["test_mae"], rounds
    with registered(ex.SPEC):
        sizes = [len(y) for _, y in ex.data(ex.SPEC.build_config(_flat(ex)))[0]]
        with pytest.raises(Exception, match="the table has 10 countries"):
            ex.data(ex.SPEC.build_config({**_flat(ex), "num-clients": 11}))
    # The size-weighted mean gives the largest client the share p = n_max / n: z_release = sigma / (p C),
    # below z when p > 1/m, so its epsilon is the run's and exceeds the equal-weight one (recomputed here).
    z_release = (1.0 * 0.5 / 10) / (max(sizes) / sum(sizes) * 0.5)
    assert summary["eps"] == pytest.approx(gaussian_epsilon(z_release, 3, 1e-5)["eps_rdp"], rel=1e-9)
    assert summary["eps"] > gaussian_epsilon(1.0, 3, 1e-5)["eps_rdp"]


def _flat(module) -> dict:
    from flower_apps.config import RUN_CONFIG_DEFAULTS, resolve
    from flower_apps.studies import STUDIES

    return resolve({**RUN_CONFIG_DEFAULTS, "study": module.STUDY, "preset": "smoke"}, STUDIES)[1]
