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
