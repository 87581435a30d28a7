"""One audited tabular-pdp run in-process, for the audit's tests and ``benchmarks/audit_detection.py`` (issue 37).

A trial is a real run through Flower's simulation path (ServerApp, ClientApps, the GDP / PDP wrappers
with their canaries and, when asked, a broken mechanism from privacy/faults.py) in a temporary
results folder; it returns the run's ``audit.json`` with its verdict. The DP noise and the canaries
come from a local seed file derived from ``seed`` (``noise-seed-file``), so a trial repeats bit for
bit. A fault needs ``PPFL_ALLOW_DP_FAULTS=1`` in the environment (the caller sets it; this module
never does).

Defaults (overridable): GDP and PDP in one run, n_eps = 1 and 40 canaries per client (20 inserted)
at the smoke preset (10 clients, T = 2). Why these: the noise tests need the noise on a release to
dominate the clients' signal along a random direction (at n_eps = 0.05, the study's default, the
signal's energy per coordinate is about twice the noise's and a 2x smaller noise hides behind it;
at n_eps = 1 it is below 1%); 20 held-out canaries per client give each client's tests power >= 0.8
against half the noise at its share of alpha. The generalization levels are fixed at the ones the
smoke preset's search finds ('2,1,0,0'), which skips the search.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from threadpoolctl import threadpool_limits

from flower_apps.common.results import read_json

TRIAL_KEYS: dict[str, Any] = {"tab-settings": "gdp,pdp", "tab-audit-canaries": 40, "tab-noise-multiplier": 1.0,
                              "tab-levels": "2,1,0,0"}


def _run_keys(fault: str, seed: int, preset: str, results_dir: Path, seed_file: Path | None,
              overrides: dict[str, Any]) -> dict[str, Any]:
    keys = {"study": "tabular-pdp", "preset": preset, "seed": seed, **TRIAL_KEYS, "results-dir": str(results_dir)}
    if fault:
        keys["dp-fault"] = fault
    if seed_file is not None:
        keys["noise-seed-file"] = str(seed_file)
    keys.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return keys


def audit_trials(trials: list[tuple[str, int]], preset: str = "smoke", seeded: bool = True,
                 **overrides: Any) -> list[dict]:
    """Several trials ``(fault, seed)`` in ONE simulation (one Ray start-up); their audit.json dicts, in order.

    ``overrides``: run keys (kebab-case, or snake_case turned into kebab-case), e.g. ``num_rounds=3`` or
    ``**{"tab-audit-canaries": 80}``. ``seeded`` (default): noise and canaries from a seed file made from
    the seed, else OS entropy. Each result gets ``trial``: fault, seed, run name, wall seconds, final MAEs.
    """
    from flower_apps.router import prepare
    from flower_apps.runner import run_many_timed
    from flower_apps.tabular_pdp.server_app import run_dir, server_main

    if not trials:
        raise ValueError("audit_trials needs at least one (fault, seed)")
    with tempfile.TemporaryDirectory(prefix="tabular-pdp-audit-trial-") as tmp:
        root = Path(tmp)
        configs = []
        for fault, seed in trials:
            seed_file = None
            if seeded:
                seed_file = root / f"noise-{seed}.seed"
                seed_file.write_text(f"tabular-pdp audit trial, seed {seed}\n")
            configs.append(prepare(_run_keys(fault, seed, preset, root, seed_file, overrides))[1])
        if len({c.run_name or c.default_run_name for c in configs}) != len(configs):
            raise ValueError(f"two trials would share a run folder: {trials}")
        # One BLAS thread in this process while the trials run: the mechanisms' level-1 BLAS calls (the norm
        # of a 17k-parameter update, 40 canaries per client) gain nothing from a second thread, and on a
        # loaded 2-core machine each call waited milliseconds for it (measured: 4 ms instead of 3 us).
        with threadpool_limits(limits=1, user_api="blas"):
            walls = run_many_timed(configs, server_main, configs[0].num_clients, run_dir)
        out = []
        for (fault, seed), cfg in zip(trials, configs):
            folder = run_dir(cfg)
            audit = read_json(folder / "audit.json")
            summary = read_json(folder / "summary.json")
            audit["trial"] = {"fault": fault, "seed": seed, "preset": preset, "run": folder.name,
                              "wall_seconds": walls.get(str(folder)),
                              "final_mae": {k: v["final_mae"] for k, v in summary["settings"].items()}}
            out.append(audit)
        return out


def audit_trial(fault: str, seed: int, preset: str = "smoke", **overrides: Any) -> dict:
    """One audited run (``fault`` '' = the correct mechanism) through the real code path: its audit.json.

    ``wall_seconds`` counts the run itself, not Ray's start-up; :func:`audit_trials` runs several in one
    simulation.
    """
    return audit_trials([(fault, seed)], preset, **overrides)[0]
