"""A run's folder for a study's ServerApp: open it safely, record rounds, finish with a summary.

    with RunRecord("my-study", cfg) as run:   # refuses a finished run / another config's folder; takes the lock
        run.round({"round": 1, "test_acc": 0.9})  # rounds.jsonl, rewritten atomically after every round
        run.finish({"final_acc": 0.9})        # summary.json with run, config_hash, wall_seconds

The built-in studies follow the same convention by hand (plus resume from round checkpoints);
:func:`flower_apps.common.results.open_run_folder` documents the refusals. A run that raises leaves its
rounds and config but no summary, so it is not "finished" and a rerun starts again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from flower_apps.common.results import (
    atomic_write_json,
    atomic_write_jsonl,
    close_run_folder,
    open_run_folder,
    run_folder,
    run_hash,
)


class RunRecord:
    """The folder ``<results-dir>/<study>/runs/<run-name or default_run_name>`` of one run."""

    def __init__(self, study: str, cfg: Any) -> None:
        self.study, self.cfg = study, cfg
        self.path = run_folder(study, cfg)
        self.rounds: list[dict] = []
        self._t0 = 0.0

    def __enter__(self) -> RunRecord:
        open_run_folder(self.path, self.cfg)
        self._t0 = time.perf_counter()
        return self

    def round(self, row: dict) -> None:
        """Append one round's row and rewrite ``rounds.jsonl`` (atomic: a crash keeps the rounds before)."""
        self.rounds.append(dict(row))
        atomic_write_jsonl(self.path / "rounds.jsonl", self.rounds)

    def finish(self, summary: dict) -> dict:
        """Write ``summary.json`` (the run is finished from now on) and return it."""
        out = {"run": self.path.name, "seed": self.cfg.seed, **summary, "config_hash": run_hash(self.cfg),
               "wall_seconds": time.perf_counter() - self._t0}
        atomic_write_json(self.path / "summary.json", out)
        return out

    def __exit__(self, *exc: object) -> None:
        close_run_folder(self.path)

    def file(self, name: str) -> Path:
        """A path inside the run folder (for the study's own files: attacks, models)."""
        return self.path / name
