"""flower_apps.common.sweep.run_pending: progress per finished run, and unfinished runs are an error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import flower_apps.runner as runner
from flower_apps.common.sweep import run_pending


def _fake_simulation(finish: set[str]):
    def run_many(configs, server_main, nodes, num_cpus, num_gpus, on_done=None):
        assert (nodes, num_cpus, num_gpus) == (3, 1.0, 0.0)
        for cfg in configs:
            if cfg.default_run_name in finish:
                on_done(cfg, server_main(None, cfg))
    return run_many


def test_progress_lines_and_resume_hint(monkeypatch, capsys):
    runs = [SimpleNamespace(default_run_name=n) for n in ("a", "b")]
    finished: set[str] = set()

    def server_main(grid, cfg):
        finished.add(cfg.default_run_name)
        return {"run": cfg.default_run_name, "wall_seconds": 1.0, "acc": 0.5}

    monkeypatch.setattr(runner, "run_many_in_process", _fake_simulation({"a", "b"}))
    run_pending(runs, server_main, lambda c: c.default_run_name in finished, nodes=3, num_cpus=1.0, num_gpus=0.0,
                describe=lambda s: f"acc {s['acc']:.2f}")
    out = capsys.readouterr().out
    assert "[1/2] a: acc 0.50" in out and "[2/2] b: acc 0.50" in out and "sweep finished" in out

    finished.clear()
    monkeypatch.setattr(runner, "run_many_in_process", _fake_simulation({"a"}))
    with pytest.raises(RuntimeError, match="1 runs did not finish, e.g. b; rerun to resume"):
        run_pending(runs, server_main, lambda c: c.default_run_name in finished, nodes=3, num_cpus=1.0,
                    num_gpus=0.0, describe=lambda s: "")


def test_pending_runs_skips_finished_and_says_so(capsys):
    from flower_apps.common.sweep import pending_runs

    runs = [SimpleNamespace(default_run_name=n) for n in ("a", "b", "c")]
    assert [r.default_run_name for r in pending_runs("x", "g", runs, lambda c: c.default_run_name == "b")] == ["a", "c"]
    assert "x sweep 'g': 3 runs, 1 already done, 2 to run" in capsys.readouterr().out


def test_pending_runs_names_what_it_counts(capsys):
    from flower_apps.common.sweep import pending_runs

    assert pending_runs("u", "linking-reduced", [1, 2], lambda s: s == 1, noun="transport measurements") == [2]
    assert "u sweep 'linking-reduced': 2 transport measurements, 1 already done, 1 to run" in capsys.readouterr().out


def _sweep(tmp_path, build, **kw):
    from flower_apps.common.sweep import sweep_main

    calls: list = []
    code = sweep_main("s", "g", build, lambda c: c.default_run_name == "done",
                      lambda pending: calls.append(("run", [c.default_run_name for c in pending])),
                      lambda configs: calls.append(("report", len(configs))) or "# report", tmp_path, **kw)
    return code, calls


def test_sweep_main_runs_the_pending_then_reports(tmp_path, capsys):
    runs = [SimpleNamespace(default_run_name=n) for n in ("done", "todo")]
    code, calls = _sweep(tmp_path, lambda: runs)
    assert code == 0 and calls == [("run", ["todo"]), ("report", 2)]
    out = capsys.readouterr().out
    assert "# report" in out and f"Tables and figures in {tmp_path.resolve()}" in out


def test_sweep_main_calls_before_first_and_skips_all_work_when_report_only(tmp_path):
    runs = [SimpleNamespace(default_run_name="todo")]
    seen: list = []
    code, calls = _sweep(tmp_path, lambda: runs, before=lambda configs: seen.append(len(configs)))
    assert code == 0 and seen == [1] and calls == [("run", ["todo"]), ("report", 1)]
    code, calls = _sweep(tmp_path, lambda: runs, report_only=True, before=lambda configs: seen.append(9))
    assert code == 0 and calls == [("report", 1)] and seen == [1]


def test_sweep_main_refuses_a_bad_grid_with_exit_status_2_and_lists(tmp_path, capsys):
    from flower_apps.config import ConfigError

    def bad():
        raise ConfigError("num-clients must be >= 1, got 0")

    assert _sweep(tmp_path, bad) == (2, [])
    assert capsys.readouterr().err.strip() == "error: num-clients must be >= 1, got 0"
    runs = [SimpleNamespace(default_run_name=n) for n in ("a", "b")]
    assert _sweep(tmp_path, lambda: runs, list_only=True) == (0, [])
    assert capsys.readouterr().out == "a\nb\n"


def test_run_keys_layers_defaults_preset_knobs_and_run():
    from flower_apps.common.sweep import run_keys, sweep_overrides
    from flower_apps.config import RUN_CONFIG_DEFAULTS
    from flower_apps.dfl_dp.config import PRESETS

    smoke = PRESETS["smoke"]
    default_rounds = RUN_CONFIG_DEFAULTS["num-rounds"]
    assert smoke["num-rounds"] != default_rounds  # else the test below proves nothing
    over = sweep_overrides("dfl-dp", "smoke", "res", {"num-rounds": default_rounds, "dataset": None})
    assert over["results-dir"].endswith("res") and "dataset" not in over
    flat = run_keys(over, {"seed": 3})
    assert flat["num-rounds"] == default_rounds  # an explicit knob wins over the preset, even at its default
    assert flat["num-clients"] == smoke["num-clients"] and flat["seed"] == 3
    assert flat["dataset"] == smoke["dataset"]


def test_sweep_parser_has_the_shared_flags():
    from flower_apps.common.sweep import add_data_args, sweep_parser

    p = sweep_parser("flower_apps.x.sweep", "Run x.\n\nmore", seeds_help="runs", default=1)
    add_data_args(p, ["a", "b"])
    args = p.parse_args(["--report-only", "--dataset", "b", "--data-fraction", "0.5"])
    assert (args.results_dir, args.seeds, args.seed0, args.num_cpus, args.report_only) == ("results", 1, 0, 1, True)
    assert (args.dataset, args.data_fraction, args.data_dir, args.device) == ("b", 0.5, None, None)
    assert p.prog == "python -m flower_apps.x.sweep" and p.description == "Run x."
