"""python -m flower_apps.sweep: a grid of run keys times seeds for any registered study."""

from __future__ import annotations

import argparse

import pytest

from flower_apps.sweep import describe, grid_runs, main, parse_grid


def test_grid_is_the_product_of_its_values_times_seeds():
    runs = grid_runs([("eps-cal", [1.0, 4.0]), ("framework", ["fl", "sequential-dfl"])], seeds=2, seed0=5)
    assert len(runs) == 8 and runs[0] == {"eps-cal": 1.0, "framework": "fl", "seed": 5}
    assert runs[-1] == {"eps-cal": 4.0, "framework": "sequential-dfl", "seed": 6}
    assert grid_runs([], seeds=1, seed0=0) == [{"seed": 0}]


@pytest.mark.parametrize("grid,seeds,match", [
    ([("lr", [0.1]), ("lr", [0.2])], 1, "given twice"),
    ([("seed", [1, 2])], 1, "use --seeds"),
    ([], 0, "--seeds must be >= 1")])
def test_bad_grids_are_refused(grid, seeds, match):
    with pytest.raises(ValueError, match=match):
        grid_runs(grid, seeds, 0)


def test_grid_values_parse_as_run_config_values():
    assert parse_grid("eps-cal=1,4.5") == ("eps-cal", [1, 4.5])
    assert parse_grid("framework=fl, sequential-dfl") == ("framework", ["fl", "sequential-dfl"])
    for bad in ("eps-cal", "eps-cal=", "=1,2", "lr=0.1,,0.2"):
        with pytest.raises(argparse.ArgumentTypeError, match="--grid wants KEY=V1,V2"):
            parse_grid(bad)


def test_list_names_every_run_and_bad_keys_stop_before_any_work(tmp_path, capsys):
    assert main(["--study", "dfl-dp", "--seeds", "2", "--grid", "eps-cal=1,4", "--set", "dp=true",
                 "--results-dir", str(tmp_path), "--list"]) == 0
    names = capsys.readouterr().out.split()
    assert names == [f"fl_C1_eps{e}_N10_T2_mnist-5k_s{s}" for e in (1, 4) for s in (0, 1)]
    assert main(["--study", "dfl-dp", "--grid", "eps-kal=1,4", "--results-dir", str(tmp_path)]) == 2
    assert "eps-kal" in capsys.readouterr().err and not (tmp_path / "dfl-dp").exists()
    assert main(["--study", "nope"]) == 2 and "registered: dfl-dp" in capsys.readouterr().err


def test_a_study_without_run_folders_is_refused(tmp_path, capsys):
    from dataclasses import dataclass, replace

    from flower_apps import example_minimal
    from flower_apps.studies import registered

    @dataclass(frozen=True)
    class Bare:  # a config with no results_dir / run_name / default_run_name: nowhere to resume from
        seed: int

    bare = replace(example_minimal.SPEC, build_config=lambda c: Bare(c["seed"]))
    with registered(bare):
        assert main(["--study", example_minimal.STUDY, "--results-dir", str(tmp_path)]) == 2
    assert "does not use run folders" in capsys.readouterr().err


def test_describe_puts_accuracy_and_epsilon_first():
    assert describe({"seed": 0, "eps": 2.0, "final_acc": 0.91234, "run": "x"}) == "final_acc 0.9123, eps 2, seed 0"
    assert describe({"run": "x"}) == "finished"
