"""Atomic result files: every write goes to a temp file in the same folder, then os.replace."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flower_apps.errors import ConfigError


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Text version of :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """JSON (indented, sorted keys) written atomically."""
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True, default=_json_default) + "\n")


def atomic_write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """JSON lines written atomically (the whole file each time)."""
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True, default=_json_default) + "\n" for r in rows))


def read_json(path: str | Path) -> Any:
    """Read a JSON file."""
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def read_jsonl(path: str | Path) -> list[dict]:
    """Read a JSON-lines file."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def config_hash(config: dict) -> str:
    """Short stable hash of a resolved config (identifies a run for resume)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


def run_identity(cfg: Any, *, with_output: bool = False) -> dict[str, Any]:
    """What makes a run's results: the fields of the keys its key table puts in the run hash.

    The one rule, read from each key's declaration (``Key.in_run_hash``, ``hash_omit_when``,
    ``hash_null_when`` in the study's key table): never where results go (results-dir, run-name),
    how long the server waits (round-timeout) or whether a finished run may be replaced (rerun); the
    study's own exclusions and conditions (ultrasound: no device or kernel choice, DP knobs null
    without DP-SGD, ...); keys added after runs were kept left out at their old behaviour (dp-fault '').
    ``cfg`` must come from ``KEYS.config_class`` (a TypeError otherwise).

    ``with_output``: also results-dir and run-name, as every run hash held them before 2026-12-01 (see
    :func:`run_hashes`).
    """
    # The class's key table, read without importing flower_apps.config (which imports this module):
    # flower_apps.config.key_table_of says the same, for callers above both.
    table = getattr(type(cfg), "key_table", None)
    if table is None or not hasattr(table, "identity") or not dataclasses.is_dataclass(cfg):
        raise TypeError(f"{type(cfg).__name__} is not a config class of a key table: derive it with "
                        "KEYS.config_class (its keys say what is in the run's identity)")
    return table.identity(cfg, with_output=with_output)


def run_hash(cfg: Any) -> str:
    """Identity of a run (a config dataclass) for resuming: the hash of :func:`run_identity`."""
    return config_hash(run_identity(cfg))


def run_hashes(cfg: Any) -> set[str]:
    """Every identity a finished run of ``cfg`` may carry: :func:`run_hash`, and the older one that also
    hashed the results folder and run name.

    Kept for the run folders written before 2026-12-01 (three of results_protocol/'s dfl-dp runs carry
    it): they stay finished where they were written. Ultrasound's hash never held those keys; the older
    identity of an ultrasound config is then one no folder carries, so it changes nothing there.
    """
    return {run_hash(cfg), config_hash(run_identity(cfg, with_output=True))}


def run_folder(study: str, cfg: Any) -> Path:
    """``<results-dir>/<study>/runs/<run-name or the config's default run name>``."""
    return Path(cfg.results_dir) / study / "runs" / (cfg.run_name or cfg.default_run_name)


def finished_hash(folder: str | Path) -> str | None:
    """The config hash of the finished run in ``folder`` (its ``summary.json``), else None."""
    p = Path(folder) / "summary.json"
    try:
        return read_json(p).get("config_hash") if p.is_file() else None
    except (OSError, ValueError):
        return None


def run_finished(folder: str | Path, cfg: Any) -> bool:
    """True when ``folder`` holds a finished run of ``cfg`` (any of :func:`run_hashes`; sweeps resume)."""
    return finished_hash(folder) in run_hashes(cfg)


def check_run_folder(folder: str | Path, cfg: Any) -> None:
    """Refuse (ConfigError) to write ``cfg``'s run into a folder that holds another config's finished run.

    Run folders are named by the config's run name, which does not spell out every key (``lr``,
    ``batch-size``, ...): two configs can share a name. A different config must not silently replace
    finished results (a finished run of the same config: :func:`check_rerun`).
    """
    other = finished_hash(folder)
    if other and other not in run_hashes(cfg):
        raise ConfigError(
            f"run folder {folder} holds a finished run of another config (config_hash {other}, this run "
            f"{run_hash(cfg)}): keys outside the run name differ; set run-name (or the sweep's --results-dir) "
            f"to keep both, or delete the folder to replace it")


class RunFinished(ConfigError):
    """The run folder holds a finished run of this config and ``rerun`` is not 'replace' (it is kept)."""


def check_rerun(folder: str | Path, cfg: Any) -> None:
    """Refuse (:class:`RunFinished`, a ConfigError) to rerun a finished run of ``cfg`` unless its ``rerun``
    key is 'replace'.

    A rerun would overwrite the kept results (and the round checkpoint a later resume needs) with a new
    draw of the noise; the sweeps skip such runs before they start. A folder without a summary (an
    unfinished run) is resumed as before.
    """
    done = finished_hash(folder)
    if done and done in run_hashes(cfg) and getattr(cfg, "rerun", "refuse") != "replace":
        raise RunFinished(f"run folder {folder} holds a finished run of this config (summary.json, config_hash "
                          f"{done}); it is kept. rerun: got 'refuse'; allowed: 'refuse', 'replace' (overwrite it), "
                          "or set another run-name to keep both")


RUN_LOCK = ".run.lock"
_HELD: dict[Path, int] = {}  # run folder -> fd of its lock file, held by this process


class RunInProgress(RuntimeError):
    """Another process is writing this run folder (it holds the folder's lock)."""


def _lock_run_folder(out: Path) -> None:
    """Hold ``out``'s lock for this process, releasing the run folder it held before.

    Two processes must never write one run folder (two sweeps over overlapping grids: the second would
    resume the first's round checkpoint and both would overwrite the same files). ``fcntl.flock`` on
    ``<folder>/.run.lock``: the kernel drops it when the process ends, crash included, so no stale lock
    survives. The study releases it when the run is written (:func:`close_run_folder`); a process writes
    one run at a time, so opening the next run's folder also releases a lock left by a run that failed;
    reopening the folder it holds keeps it. Where ``fcntl`` is missing (Windows) nothing is
    locked.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on the platforms this project runs on
        return
    key = out.resolve()
    if key in _HELD:
        return
    fd = os.open(key / RUN_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunInProgress(f"run folder {out} is being written by another process (it holds {RUN_LOCK}); "
                            f"wait for it, or stop it and rerun to resume") from None
    for old in list(_HELD):
        os.close(_HELD.pop(old))  # closing the descriptor releases its flock
    _HELD[key] = fd


def close_run_folder(folder: str | Path) -> None:
    """Release ``folder``'s lock (the run is written: its summary is there). Safe to call twice."""
    fd = _HELD.pop(Path(folder).resolve(), None)
    if fd is not None:
        os.close(fd)


def open_run_folder(folder: str | Path, cfg: Any) -> Path:
    """Create a run's folder, take its lock and write its resolved config (call it only after the data
    validated).

    Refuses, before writing anything, a folder holding another config's finished run
    (:func:`check_run_folder`), this config's finished run unless ``rerun='replace'``
    (:func:`check_rerun`) and one that another process is writing (:class:`RunInProgress`).
    """
    import dataclasses

    check_run_folder(folder, cfg)
    check_rerun(folder, cfg)
    out = Path(folder)
    if not out.exists():
        _CREATED.add(out.resolve())
    out.mkdir(parents=True, exist_ok=True)
    _lock_run_folder(out)
    atomic_write_json(out / "config.json", dataclasses.asdict(cfg))
    return out


#: run folders this process created (open_run_folder), which :func:`discard_unstarted` may remove
_CREATED: set[Path] = set()
#: what a run folder holds before its first round: nothing a refused run needs to keep
_BEFORE_FIRST_ROUND = frozenset({"config.json", RUN_LOCK, "class_counts.csv", "class_counts.png"})


def discard_unstarted(folder: str | Path) -> bool:
    """Remove ``folder`` when this process created it and the run was refused before its first round
    (e.g. two SuperNodes claim one client): a refused run leaves no folder behind. A folder that was there
    before, or that holds anything a run wrote later (rounds, a checkpoint), is kept. True when removed."""
    import shutil

    out = Path(folder)
    key = out.resolve()
    if key not in _CREATED or not out.is_dir():
        return False
    if any(p.name not in _BEFORE_FIRST_ROUND for p in out.iterdir()):
        return False
    close_run_folder(out)
    shutil.rmtree(out)
    _CREATED.discard(key)
    return True


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
