"""One audited dfl-dp run in-process, for the audit's tests and ``benchmarks/audit_detection.py`` (issue 37).

A trial is a real run through Flower's simulation path (ServerApp, ClientApps, ``MatchedPerturbation``
with its canaries and, when asked, a broken mechanism from privacy/faults.py) in a temporary
results folder; it returns the run's ``audit.json`` with its verdict. The DP noise and the canaries
come from a local seed file derived from ``seed`` (``noise-seed-file``), so a trial repeats bit for
bit. A fault needs ``PPFL_ALLOW_DP_FAULTS=1`` in the environment (the caller sets it; this module
never does).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from flower_apps.common.results import read_json

if TYPE_CHECKING:
    from flwr.serverapp import Grid

#: canaries of a trial unless overridden. At the smoke preset (N = 10, T = 2), 40 canaries already flag
#: every fault in FL in 10 of 10 seeds, but a skipped clip in sequential DFL in only 9 of 10 (release-norm
#: ratio 1.48 +- 0.16 against a threshold near 1.28); with 100 (50 held out: 100 noise projections, 50
#: unclipped canaries) the ratio is 2.5-3.0 and the correct mechanism stays at 0.90-1.00 (5 seeds each)
TRIAL_CANARIES = 100


def _run_keys(fault: str, seed: int, preset: str, framework: str, results_dir: Path, seed_file: Path | None,
              overrides: dict[str, Any]) -> dict[str, Any]:
    keys = {"study": "dfl-dp", "preset": preset, "framework": framework, "dp": True, "seed": seed,
            "audit-canaries": TRIAL_CANARIES, "results-dir": str(results_dir)}
    if fault:
        keys["dp-fault"] = fault
    if seed_file is not None:
        keys["noise-seed-file"] = str(seed_file)
    keys.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return keys


def audit_trials(trials: list[tuple], preset: str = "smoke", framework: str = "fl",
                 seeded: bool = True, **overrides: Any) -> list[dict]:
    """Several trials in ONE simulation (one Ray start-up); their audit.json dicts, in order.

    ``trials``: ``(fault, seed)`` or ``(fault, seed, framework)`` (default ``framework``); fault '' is
    the correct mechanism. ``overrides``: run keys (kebab-case, or snake_case turned into kebab-case),
    e.g. ``num_rounds=2`` or ``**{"audit-canaries": 200}``. ``seeded`` (default): noise and canaries
    from a seed file made from the seed, else OS entropy. Each result gets ``trial``: fault, seed,
    framework, run name, final accuracy and ``wall_seconds`` (from the previous trial's end; the
    first trial's includes Ray's start-up, see ``wall_seconds_excludes_startup``).
    """
    from flower_apps.dfl_dp.server_app import run_dir, server_main
    from flower_apps.router import prepare
    from flower_apps.runner import run_many_timed

    if not trials:
        raise ValueError("audit_trials needs at least one (fault, seed)")
    with tempfile.TemporaryDirectory(prefix="dfl-dp-audit-trial-") as tmp:
        root = Path(tmp)
        configs = []
        trials = [(t[0], int(t[1]), t[2] if len(t) > 2 else framework) for t in trials]
        for fault, seed, fw in trials:
            seed_file = None
            if seeded:
                seed_file = root / f"noise-{seed}.seed"
                seed_file.write_text(f"dfl-dp audit trial, seed {seed}\n")
            configs.append(prepare(_run_keys(fault, seed, preset, fw, root, seed_file, overrides))[1])
        if len({c.default_run_name if not c.run_name else c.run_name for c in configs}) != len(configs):
            raise ValueError(f"two trials would share a run folder: {trials}")
        num_nodes = max(1, -(-configs[0].num_clients // configs[0].clients_per_message))
        walls = run_many_timed(configs, server_main, num_nodes, run_dir)
        out = []
        for i, ((fault, seed, fw), cfg) in enumerate(zip(trials, configs)):
            folder = run_dir(cfg)
            audit = read_json(folder / "audit.json")
            audit["trial"] = {"fault": fault, "seed": seed, "preset": preset, "framework": fw,
                              "run": folder.name, "wall_seconds": walls.get(str(folder)),
                              "wall_seconds_excludes_startup": i > 0,
                              "final_acc": read_json(folder / "summary.json")["final_acc"]}
            out.append(audit)
        return out


def audit_trial(fault: str, seed: int, preset: str = "smoke", framework: str = "fl", **overrides: Any) -> dict:
    """One audited run (``fault`` '' = the correct mechanism) through the real code path: its audit.json.

    Its ``wall_seconds`` include Ray's start-up; :func:`audit_trials` runs several in one simulation.
    """
    return audit_trials([(fault, seed)], preset, framework, **overrides)[0]


def audit_replays(seed: int, faults: list[str], preset: str = "smoke", framework: str = "fl",
                  **overrides: Any) -> list[dict]:
    """The correct mechanism trained once at ``seed`` (a real run, recorded), then each of ``faults``
    replayed on its clients' recorded updates (flower_apps/common/replay.py): audit.json dicts, the
    recorded run's first.

    Each replay runs the real ``server_main`` (strategy stack, fault, canaries through the clip, auditor)
    on a grid that answers with the recorded clients' updates; noise and canaries come from the same seed
    file as the recorded run, as in :func:`audit_trials`. A replay's ``trial`` says ``replayed``.
    """
    from flower_apps.common.replay import RecordingGrid, ReplayGrid
    from flower_apps.dfl_dp.server_app import run_dir, server_main
    from flower_apps.router import prepare
    from flower_apps.runner import run_many_timed
    from strategies.flwr_adapter import task_identity

    with tempfile.TemporaryDirectory(prefix="dfl-dp-audit-replay-") as tmp:
        root = Path(tmp)
        seed_file = root / f"noise-{seed}.seed"
        seed_file.write_text(f"dfl-dp audit trial, seed {seed}\n")
        cfg = prepare(_run_keys("", seed, preset, framework, root, seed_file, overrides))[1]
        recorded: dict[str, Any] = {}

        def recording_main(grid, c):
            rg = RecordingGrid(grid)
            out = server_main(rg, c)
            recorded.update(exchanges=rg.exchanges, nodes=sorted(grid.get_node_ids()))
            return out

        num_nodes = max(1, -(-cfg.num_clients // cfg.clients_per_message))
        walls = run_many_timed([cfg], recording_main, num_nodes, run_dir)
        first = read_json(run_dir(cfg) / "audit.json")
        first["trial"] = {"fault": "", "seed": seed, "preset": preset, "framework": framework,
                          "run": run_dir(cfg).name, "wall_seconds": walls.get(str(run_dir(cfg))), "replayed": False,
                          "final_acc": read_json(run_dir(cfg) / "summary.json")["final_acc"]}
        out = [first]
        for fault in faults:
            rcfg = prepare(_run_keys(fault, seed, preset, framework, root, seed_file,
                                     {**overrides, "run-name": f"replay-{fault or 'correct'}"}))[1]
            t0 = time.perf_counter()
            grid = ReplayGrid(recorded["exchanges"], recorded["nodes"])
            with task_identity():
                # typed in flower_apps/common/replay.py: ReplayGrid is a duck-typed Grid, not a subclass
                server_main(cast("Grid", grid), rcfg)
            if not grid.finished:
                raise RuntimeError(f"replay of {fault!r} sent {grid._next} of the {len(grid.exchanges)} recorded messages")
            audit = read_json(run_dir(rcfg) / "audit.json")
            audit["trial"] = {"fault": fault, "seed": seed, "preset": preset, "framework": framework,
                              "run": run_dir(rcfg).name, "wall_seconds": time.perf_counter() - t0, "replayed": True}
            out.append(audit)
        return out
