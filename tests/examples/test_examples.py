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

EXAMPLES = ("seq_dfl_fashion",)
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
