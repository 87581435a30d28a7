"""What every study's sweep does: build its configs, run the pending ones, report.

:func:`sweep_main` is a sweep's command (refuse a bad grid with exit status 2, resume, report);
:func:`pending_runs` says what is left of any resumable list (learning runs, transport
measurements); :func:`run_pending` runs configs with progress lines, each through ``flwr run`` on one
local SuperLink per sweep (``--engine superlink``, the default) or all in one in-process simulation
(``--engine inprocess``; see :mod:`flower_apps.runner` for what each costs).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.serverapp import Grid


def sweep_parser(module: str, doc: str, seeds_help: str = "number of seeds (default: the grid's)",
                 **seeds_kw: Any) -> argparse.ArgumentParser:
    """The command line of ``python -m <module>`` with the flags every sweep has.

    --results-dir (the run key's default and doc), --seeds, --seed0, --num-cpus, --engine, --report-only,
    --set, --noise-seed-file; ``doc``'s first line is the description. The study adds its grid and knobs
    (:func:`add_key_flags` for the flags that set run keys).
    """
    from flower_apps.config import COMMON_KEYS

    results = COMMON_KEYS["results-dir"]
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n")[0])
    p.add_argument("--results-dir", default=results.default, help=_escape(f"{results.doc} (run key results-dir)"))
    p.add_argument("--seeds", type=int, help=seeds_help, **seeds_kw)
    p.add_argument("--seed0", type=int, default=0, help="first seed")
    p.add_argument("--num-cpus", type=float, default=1, help="CPUs per virtual SuperNode (Ray client resources)")
    p.add_argument("--engine", choices=("superlink", "inprocess"), default=None,
                   help="superlink: each run through flwr run on one local SuperLink of this sweep (flwr 1.42's "
                        "supported path); inprocess: all runs in one in-process simulation (deprecated "
                        "run_simulation; one Ray start-up: faster for many short runs). Default: $PPFL_ENGINE, else superlink")
    p.add_argument("--report-only", action="store_true", help="only rebuild tables and figures")
    p.add_argument("--set", action="append", default=[], type=parse_set, metavar="KEY=VALUE", dest="set",
                   help="any run key for every run of the sweep, as in flwr run --run-config (repeatable; "
                        "e.g. --set lr=0.01 --set us-head-init=zero); a key the grid sweeps is refused")
    # Not the run key itself: each study turns the file into its own keys (ultrasound: us-noise-mode='seeded'
    # and the clients' environment, never the run config).
    p.add_argument("--noise-seed-file", type=lambda f: str(Path(f).resolve()),
                   help="a LOCAL secret file that seeds the DP noise, for bit-reproducible DP runs "
                        "(default: secure noise from OS entropy; see README, Privacy). dfl-dp / tabular-pdp: "
                        "the server's run key noise-seed-file; ultrasound: us-noise-mode='seeded' and each "
                        "local client reads the file from $PPFL_NOISE_SEED_FILE")
    return p


@dataclass(frozen=True)
class KeyFlag:
    """A sweep flag that sets a run key: its type, choices and help come from the key's declaration.

    ``flag``: the flag's name ('' = ``--<key>``); ``axis``: it takes several values (``nargs='+'``), a
    grid axis the sweep iterates rather than one value for every run; ``without``: key values the flag
    refuses (removed from its choices); ``note``: what this sweep adds to the key's doc; ``default``:
    what a flag left out means, in words.
    """

    key: str
    flag: str = ""
    axis: bool = False
    without: tuple[Any, ...] = ()
    note: str = ""
    default: str = "the preset's"

    @property
    def name(self) -> str:
        return self.flag or f"--{self.key}"

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


# --dataset, --data-dir, --data-fraction, --device: the same-named run keys, for every run of the sweep.
DATA_FLAGS = (KeyFlag("dataset"), KeyFlag("data-dir"), KeyFlag("data-fraction"), KeyFlag("device"))


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # argparse formats help with %


def _parse_bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def add_key_flags(p: argparse.ArgumentParser | Any, table: Any, flags: Sequence[KeyFlag]) -> None:
    """Add one argparse flag per :class:`KeyFlag`, from the key of ``table`` (a ``KeyTable``) it sets.

    The flag's type is the key's (true/false for a bool), its choices the key's fixed ones (less ``without``;
    a registry's names are left to the run-key check, which reads the registry live and names the nearest),
    its help the key's doc (and the flag's note), naming the run key; its default is None (left out:
    the preset's value stays). ``p`` may be an argument group. An unknown key is a ValueError.
    """
    for f in flags:
        if f.key not in table.keys:
            raise ValueError(f"{f.name}: {f.key!r} is not a run key of study {table.study!r}")
        key = table.keys[f.key]
        kw: dict[str, Any] = {"type": _parse_bool if key.type is bool else key.type, "default": None}
        if isinstance(key.choices, (tuple, list)) and not key.many:  # a registry's names: the key checks them live
            kw["choices"] = [c for c in key.shown_choices() if c not in f.without]
        if f.axis:
            kw["nargs"] = "+"
        note = f"; {f.note}" if f.note else ""
        values = "the values it sweeps" if f.axis else "every run"
        kw["help"] = _escape(f"{key.doc}{note} (run key {key.name}, {values}; default: {f.default})")
        p.add_argument(f.name, **kw)


def key_knobs(args: argparse.Namespace, flags: Sequence[KeyFlag]) -> dict[str, Any]:
    """Run key -> the value its flag gave, for the flags that set one value for every run (not axes).

    None for a flag left out (:func:`sweep_overrides` drops it: the preset's value stays).
    """
    return {f.key: getattr(args, f.dest) for f in flags if not f.axis}


def parse_set(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--set`` as (key, value); VALUE is read as in ``flwr run --run-config`` (TOML:
    ``0.01``, ``true``, ``'zero'``), and a bare word that is not TOML (``zero``) as a string."""
    import tomllib

    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key or not raw:
        raise argparse.ArgumentTypeError(f"--set wants KEY=VALUE, got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


# Keys a sweep sets itself, from its own flags.
SWEEP_OWNED = ("study", "preset", "results-dir")


class Overrides(dict):
    """A sweep's run keys (:func:`sweep_overrides`); ``sets`` are the keys that came from ``--set``."""

    sets: frozenset[str] = frozenset()


def sweep_overrides(study: str, preset: str, results_dir: str, knobs: dict[str, Any],
                    sets: Sequence[tuple[str, Any]] = ()) -> dict[str, Any]:
    """Run keys of every run of a sweep: study, preset, the absolute results folder, the given knobs, ``--set``.

    ``knobs`` maps run keys to command-line values; those left out (None) keep the preset's value.
    ``sets`` are ``--set`` pairs; a key also given by a flag, twice, or owned by the sweep is refused
    (ConfigError). Unknown keys are refused later by the run-config check, with the nearest valid key.
    """
    from flower_apps.config import ConfigError

    out = Overrides({"study": study, "preset": preset, "results-dir": str(Path(results_dir).resolve()),
                     **{k: v for k, v in knobs.items() if v is not None}})
    given: set[str] = set()
    for key, value in sets:
        if key in SWEEP_OWNED:
            raise ConfigError(f"--set {key}: the sweep sets '{key}' itself (use its own flag)")
        if key in given or key in out:
            raise ConfigError(f"--set {key}: given twice (by --set or by a flag of the sweep)")
        given.add(key)
        out[key] = value
    out.sets = frozenset(given)
    return out


def run_keys(overrides: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One run's flat, checked run config: defaults < the study's preset < the sweep's knobs < the run's keys.

    The preset wins over defaults but not over a knob the sweep sets, even one equal to its default.
    A key the user gave with ``--set`` that the grid varies run by run is refused (ConfigError): the
    run's value would silently win.
    """
    from flower_apps.config import RUN_CONFIG_DEFAULTS, ConfigError, resolve
    from flower_apps.studies import STUDIES

    clash = sorted(getattr(overrides, "sets", frozenset()) & set(run))
    if clash:
        raise ConfigError(f"--set {clash[0]}: this grid sets '{clash[0]}' run by run; use the sweep's own flag for it")

    _, flat = resolve({**RUN_CONFIG_DEFAULTS, **overrides, **run}, STUDIES, given={*overrides, *run})
    return flat


def run_pending(pending: list[Any], server_main: Callable[[Grid, Any], dict], is_complete: Callable[[Any], bool],
                *, nodes: int, num_cpus: float, num_gpus: float, describe: Callable[[dict], str],
                engine: str | None = None) -> None:
    """Run ``pending`` configs on ``nodes`` virtual SuperNodes, printing progress.

    ``engine``: 'superlink' (one ``flwr run`` per config on one local SuperLink), 'inprocess' (one
    simulation for all), None: :func:`flower_apps.runner.pick_engine` decides. ``describe(summary)`` is
    the study's one-line result of a finished run. Raises if any run did not finish (each finished run
    is already written: a rerun resumes).
    """
    from flower_apps.runner import run_many

    t0 = time.perf_counter()
    done = [0]

    def on_done(cfg: Any, summary: dict) -> None:
        done[0] += 1
        el = time.perf_counter() - t0
        eta = el / done[0] * (len(pending) - done[0])
        name = summary.get("run") or cfg.run_name or cfg.default_run_name
        wall = f"{summary['wall_seconds']:.0f}s; " if "wall_seconds" in summary else ""
        print(f"[{done[0]}/{len(pending)}] {name}: {describe(summary)} "
              f"({wall}sweep {el:.0f}s elapsed, ETA {eta:.0f}s)", flush=True)

    run_many(pending, server_main, nodes, num_cpus, num_gpus, on_done=on_done, engine=engine)
    missing = [c for c in pending if not is_complete(c)]
    if missing:
        raise RuntimeError(f"{len(missing)} runs did not finish, e.g. {missing[0].default_run_name}; rerun to resume")
    print(f"sweep finished in {time.perf_counter() - t0:.0f}s", flush=True)


def unique_runs(study: str, configs: Sequence[Any]) -> list[Any]:
    """``configs`` without exact repeats; refuses (ConfigError) two configs that would share a run folder.

    A run folder is named by the run name, which does not spell out every key: two different configs
    with one name would overwrite each other. Checked before any run starts.
    """
    from flower_apps.common.results import run_folder, run_hash
    from flower_apps.config import ConfigError

    out: list[Any] = []
    seen: dict[Any, str] = {}  # run folder -> the config hash first seen there
    for cfg in configs:
        folder, rid = run_folder(study, cfg), run_hash(cfg)
        if folder in seen:
            if seen[folder] != rid:
                raise ConfigError(f"two runs of this sweep share the run folder {folder} with different configs "
                                  f"(config_hash {seen[folder]} and {rid}): a key outside the run name differs")
            continue
        seen[folder] = rid
        out.append(cfg)
    return out


def check_run_folders(study: str, configs: Sequence[Any]) -> None:
    """Refuse (ConfigError), before any run starts, a config whose folder holds another config's finished run."""
    from flower_apps.common.results import check_run_folder, run_folder

    for cfg in configs:
        check_run_folder(run_folder(study, cfg), cfg)


def pending_runs(study: str, grid: str, configs: Sequence[Any], is_complete: Callable[[Any], bool],
                 noun: str = "runs") -> list[Any]:
    """The items not finished yet (resume), after one line saying how many are done and to run."""
    pending = [c for c in configs if not is_complete(c)]
    print(f"{study} sweep '{grid}': {len(configs)} {noun}, {len(configs) - len(pending)} already done, "
          f"{len(pending)} to run", flush=True)
    return pending


def sweep_main(study: str, grid: str, build: Callable[[], list[Any]], is_complete: Callable[[Any], bool],
               run: Callable[[list[Any]], None], report: Callable[[list[Any]], str], out: Path, *,
               report_only: bool = False, list_only: bool = False,
               before: Callable[[list[Any]], None] | None = None) -> int:
    """A sweep's command: build the configs, run the pending ones, rebuild and print the report.

    ``build()`` raises ConfigError / ValueError for a bad grid (printed as one line, exit status 2).
    ``run(pending)`` gets the unfinished configs; ``before(configs)``, if given, runs first (a
    study's own resumable phase, e.g. network-only measurements). ``report(configs)`` returns
    the Markdown of the tables written under ``out``. ``list_only`` prints the run names and stops.
    """
    from flower_apps.config import ConfigError

    try:
        configs = unique_runs(study, build())
        if not report_only and not list_only:
            check_run_folders(study, configs)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if list_only:
        print("\n".join(c.default_run_name for c in configs))
        return 0
    if not report_only:
        if before is not None:
            before(configs)
        pending = pending_runs(study, grid, configs, is_complete) if configs else []
        if pending:
            run(pending)
    print(report(configs))
    print(f"Tables and figures in {Path(out).resolve()}")
    line = audit_violations(study, configs)
    if line:  # one loud line, last, and a failing exit status: a sweep never ends "fine" on a broken mechanism
        print(line, file=sys.stderr)
        return 1
    return 0


def audit_verdicts(study: str, configs: Sequence[Any]) -> dict[str, str]:
    """Run name -> the verdict in its ``audit.json`` (privacy.audit.verdict), for the configs' audited runs."""
    from flower_apps.common.results import read_json, run_folder

    out = {}
    for cfg in configs:
        path = run_folder(study, cfg) / "audit.json"
        if path.is_file():
            verdict = read_json(path).get("verdict")
            out[path.parent.name] = verdict if isinstance(verdict, str) else "none"
    return out


def audit_violations(study: str, configs: Sequence[Any]) -> str:
    """The loud line naming the sweep's runs whose audit verdict is ``violation`` ('' when none is)."""
    from privacy.audit.verdict import loud_line

    return loud_line(study, audit_verdicts(study, configs))
