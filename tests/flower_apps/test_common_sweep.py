"""flower_apps.common.sweep.run_pending: progress per finished run, and unfinished runs are an error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import flower_apps.runner as runner
from flower_apps.common.sweep import run_pending
from flower_apps.config import SHARED_KEYS, Key, KeyTable


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


class _Named:
    @property
    def default_run_name(self) -> str:
        return self.sw_name


# A study config as a sweep reads it: its run name, where its folder goes, and a key outside the name (lr).
_TABLE = KeyTable("s", (SHARED_KEYS["lr"], Key("sw-name", "", str, doc="the test run's folder name")))
_RunConfig = _TABLE.config_class("_RunConfig", base=_Named)


def _config(name: str, results_dir: str = "res", lr: float = 0.01):
    return _TABLE.build(_RunConfig, {**_TABLE.defaults(), "sw-name": name, "results-dir": results_dir, "lr": lr})


def _sweep(tmp_path, build, **kw):
    from flower_apps.common.sweep import sweep_main

    calls: list = []
    code = sweep_main("s", "g", build, lambda c: c.default_run_name == "done",
                      lambda pending: calls.append(("run", [c.default_run_name for c in pending])),
                      lambda configs: calls.append(("report", len(configs))) or "# report", tmp_path, **kw)
    return code, calls


def test_sweep_main_runs_the_pending_then_reports(tmp_path, capsys):
    runs = [_config(n, str(tmp_path)) for n in ("done", "todo")]
    code, calls = _sweep(tmp_path, lambda: runs)
    assert code == 0 and calls == [("run", ["todo"]), ("report", 2)]
    out = capsys.readouterr().out
    assert "# report" in out and f"Tables and figures in {tmp_path.resolve()}" in out


def test_sweep_main_calls_before_first_and_skips_all_work_when_report_only(tmp_path):
    runs = [_config("todo", str(tmp_path))]
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
    runs = [_config(n, str(tmp_path)) for n in ("a", "b")]
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
    from flower_apps.common.sweep import DATA_FLAGS, add_key_flags, sweep_parser
    from flower_apps.tabular_pdp.study import KEYS

    p = sweep_parser("flower_apps.x.sweep", "Run x.\n\nmore", seeds_help="runs", default=1)
    add_key_flags(p, KEYS, DATA_FLAGS)
    args = p.parse_args(["--report-only", "--dataset", "cancer-csv", "--data-fraction", "0.5"])
    assert (args.results_dir, args.seeds, args.seed0, args.num_cpus, args.report_only) == ("results", 1, 0, 1, True)
    assert (args.dataset, args.data_fraction, args.data_dir, args.device) == ("cancer-csv", 0.5, None, None)
    assert p.prog == "python -m flower_apps.x.sweep" and p.description == "Run x."


def test_key_flags_take_type_choices_and_doc_from_the_key(capsys):
    from flower_apps.common.sweep import KeyFlag, add_key_flags, key_knobs, sweep_parser
    from flower_apps.dfl_dp.study import KEYS

    flags = (KeyFlag("num-clients", "--clients", note="keep 100"), KeyFlag("framework", "--frameworks", axis=True),
             KeyFlag("dp"), KeyFlag("data-part", without=("shadow",)))
    p = sweep_parser("flower_apps.x.sweep", "Run x.")
    add_key_flags(p, KEYS, flags)
    args = p.parse_args(["--clients", "7", "--frameworks", "fl", "sequential-dfl", "--dp", "false"])
    assert key_knobs(args, flags) == {"num-clients": 7, "dp": False, "data-part": None}  # the axis is the sweep's
    assert args.frameworks == ["fl", "sequential-dfl"]
    for bad in (["--clients", "x"], ["--frameworks", "fedprox"], ["--dp", "yes"], ["--data-part", "shadow"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)
    assert "invalid choice: 'shadow'" in capsys.readouterr().err
    p.print_help()
    text = " ".join(capsys.readouterr().out.split())
    assert "number of logical clients (nodes in the decentralized studies); keep 100 (run key num-clients" in text
    assert "fl (FedAvg) or sequential-dfl (token passing) (run key framework, the values it sweeps" in text
    with pytest.raises(ValueError, match="'nope' is not a run key of study 'dfl-dp'"):
        add_key_flags(p, KEYS, (KeyFlag("nope"),))


def test_set_values_are_read_as_in_flwr_run_config():
    import argparse

    from flower_apps.common.sweep import parse_set

    assert parse_set("lr=0.01") == ("lr", 0.01)
    assert parse_set("num-rounds=10") == ("num-rounds", 10)
    assert parse_set("us-dp-sgd=true") == ("us-dp-sgd", True)
    assert parse_set("us-head-init='zero'") == ("us-head-init", "zero")
    assert parse_set("us-head-init=zero") == ("us-head-init", "zero")  # a bare word is a string
    assert parse_set(" run-name = a b ") == ("run-name", "a b")
    for bad in ("lr", "=1", "lr="):
        with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
            parse_set(bad)


def test_set_reaches_every_run_and_wins_over_the_preset():
    from flower_apps.common.sweep import run_keys, sweep_overrides
    from flower_apps.ultrasound.config import PRESETS

    assert PRESETS["cpu"]["lr"] != 0.01  # the preset sets another lr, else this proves nothing
    over = sweep_overrides("ultrasound", "cpu", "res", {"num-rounds": 2}, [("lr", 0.01), ("us-head-init", "zero")])
    for seed in (0, 1):
        flat = run_keys(over, {"seed": seed})
        assert (flat["lr"], flat["us-head-init"], flat["num-rounds"], flat["seed"]) == (0.01, "zero", 2, seed)


@pytest.mark.parametrize("sets, message", [
    ([("num-rounds", 3)], "--set num-rounds: given twice"),      # also set by the sweep's own flag
    ([("lr", 0.1), ("lr", 0.2)], "--set lr: given twice"),
    ([("results-dir", "x")], "--set results-dir: the sweep sets 'results-dir' itself"),
    ([("preset", "paper")], "--set preset: the sweep sets 'preset' itself"),
])
def test_set_refuses_a_key_given_twice_or_owned_by_the_sweep(sets, message):
    from flower_apps.common.sweep import sweep_overrides
    from flower_apps.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        sweep_overrides("ultrasound", "cpu", "res", {"num-rounds": 2}, sets)


def test_set_of_a_key_the_grid_sweeps_is_refused_not_silently_lost():
    from flower_apps.common.sweep import run_keys, sweep_overrides
    from flower_apps.config import ConfigError

    over = sweep_overrides("dfl-dp", "smoke", "res", {}, [("seed", 7)])
    with pytest.raises(ConfigError, match="this grid sets 'seed' run by run"):
        run_keys(over, {"seed": 0})


def test_two_configs_sharing_a_run_folder_are_refused_before_any_run(tmp_path, capsys):
    from flower_apps.common.sweep import unique_runs
    from flower_apps.config import ConfigError

    a, a_again, b = _config("a", str(tmp_path)), _config("a", str(tmp_path)), _config("b", str(tmp_path))
    assert unique_runs("s", [a, b, a_again]) == [a, b]  # the same config twice runs once
    other_lr = _config("a", str(tmp_path), lr=0.1)  # same run name, another config
    with pytest.raises(ConfigError, match="share the run folder .*/s/runs/a with different configs"):
        unique_runs("s", [a, other_lr])
    code, calls = _sweep(tmp_path, lambda: [a, other_lr])
    assert (code, calls) == (2, [])
    assert "share the run folder" in capsys.readouterr().err


def test_a_finished_run_of_another_config_is_never_overwritten(tmp_path, capsys):
    from flower_apps.common.results import RunFinished, atomic_write_json, open_run_folder, run_folder, run_hash
    from flower_apps.config import ConfigError

    old, new = _config("a", str(tmp_path), lr=0.01), _config("a", str(tmp_path), lr=0.1)
    folder = run_folder("s", old)
    open_run_folder(folder, old)
    atomic_write_json(folder / "summary.json", {"config_hash": run_hash(old), "acc": 0.9})
    with pytest.raises(RunFinished, match="holds a finished run of this config"):
        open_run_folder(folder, old)  # the same config again: kept too (rerun='replace' overwrites it)
    with pytest.raises(ConfigError, match=f"holds a finished run of another config \\(config_hash {run_hash(old)}"):
        open_run_folder(folder, new)
    assert (folder / "summary.json").read_text().count("0.9") == 1  # untouched
    # a sweep says so before its simulation starts (exit status 2, nothing run)
    code, calls = _sweep(tmp_path, lambda: [new])
    assert (code, calls) == (2, []) and "holds a finished run of another config" in capsys.readouterr().err
    # an unfinished folder (crashed run, no summary) is simply reused
    (folder / "summary.json").unlink()
    open_run_folder(folder, new)


def test_a_results_folder_can_move_and_older_runs_stay_finished(tmp_path):
    import dataclasses

    from flower_apps.common.results import atomic_write_json, config_hash, run_finished, run_folder, run_hash

    here, there = _config("a", str(tmp_path / "here")), _config("a", str(tmp_path / "there"))
    assert run_hash(here) == run_hash(there)  # where results go is not part of a run's identity
    folder = run_folder("s", there)
    atomic_write_json(folder / "summary.json", {"config_hash": run_hash(here)})  # finished "here", moved "there"
    assert run_finished(folder, there)
    # a summary written before 2026-12-01 (its hash included the results folder and run name) still counts
    legacy = config_hash({k: v for k, v in dataclasses.asdict(there).items() if k not in ("round_timeout", "rerun")})
    atomic_write_json(folder / "summary.json", {"config_hash": legacy})
    assert run_finished(folder, there) and not run_finished(folder, dataclasses.replace(there, lr=0.5))


def test_a_run_folder_another_process_writes_is_refused_and_a_sweep_skips_it(tmp_path, monkeypatch, capsys):
    import fcntl
    import os

    from flower_apps.common.results import RUN_LOCK, RunInProgress, close_run_folder, open_run_folder, run_folder

    a, b = _config("a", str(tmp_path)), _config("b", str(tmp_path))
    fa, fb = run_folder("s", a), run_folder("s", b)
    fa.mkdir(parents=True)
    other = os.open(fa / RUN_LOCK, os.O_CREAT | os.O_RDWR)  # "another process": its own open file description
    fcntl.flock(other, fcntl.LOCK_EX)
    with pytest.raises(RunInProgress, match=f"run folder {fa} is being written by another process"):
        open_run_folder(fa, a)
    assert not (fa / "config.json").exists()  # refused before writing anything
    fcntl.flock(other, fcntl.LOCK_UN)

    def taken_by_us(folder) -> bool:  # can another descriptor lock it now?
        fd = os.open(folder / RUN_LOCK, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    open_run_folder(fa, a)
    assert taken_by_us(fa)
    open_run_folder(fa, a)  # this process reopens the folder it holds (a resumed run): allowed
    open_run_folder(fb, b)  # the next run's folder: the last one's lock goes (a run that failed left it)
    assert taken_by_us(fb) and not taken_by_us(fa)
    close_run_folder(fb)  # the run is written
    assert not taken_by_us(fb)
    close_run_folder(fb)  # twice: harmless
    os.close(other)

    # the simulation loop skips a run another process is writing and goes on with the next
    def server_main(grid, cfg):
        if cfg.default_run_name == "a":
            raise RunInProgress("run folder a is being written by another process")
        return {"run": cfg.default_run_name}

    done = []
    monkeypatch.setattr(runner, "simulate", lambda app, *a, **k: app._main(None, None))
    runner.run_many_in_process([a, b], server_main, 1, on_done=lambda cfg, s: done.append(s["run"]))
    assert done == ["b"] and "skipped: run folder a is being written by another process" in capsys.readouterr().out


def test_sweep_main_ends_with_one_loud_line_and_exit_1_when_an_audit_verdict_is_violation(tmp_path, capsys):
    import json

    runs = [_config(n, str(tmp_path)) for n in ("done", "todo", "plain")]
    for name, verdict in (("done", "consistent"), ("todo", "violation")):
        folder = tmp_path / "s" / "runs" / name
        folder.mkdir(parents=True)
        (folder / "audit.json").write_text(json.dumps({"verdict": verdict}))
    code, _ = _sweep(tmp_path, lambda: runs)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("AUDIT VIOLATION in s: 1 run(s)") and "todo" in err[-1]
    assert "done" not in err[-1]
    (tmp_path / "s" / "runs" / "todo" / "audit.json").write_text(json.dumps({"verdict": "underpowered"}))
    code, _ = _sweep(tmp_path, lambda: runs)
    assert code == 0 and "AUDIT VIOLATION" not in capsys.readouterr().err
