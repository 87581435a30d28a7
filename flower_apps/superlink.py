"""Studies run the way flwr 1.42 supports: ``flwr run`` against one local simulation SuperLink per sweep.

:class:`LocalSuperLink` starts ``flower-superlink --insecure --simulation
--disable-runtime-dependency-installation`` on a free loopback port of its own, with a private
``FLWR_HOME`` (its state, the installed FABs, and the CLI's connection file) in a temporary folder,
so it never meets the ``flwr`` default local SuperLink (port 39091) or another user's. Each run is
one ``flwr run <project> <connection> --stream`` with the run's whole config (``--run-config``, a
TOML file) and the federation options (``num-supernodes``, ``client-resources-num-cpus`` / ``-gpus``:
flwr's defaults are 2 nodes and 2 CPUs per client, the in-process path's 1 CPU, which sets the
clients' torch threads, so the numbers match). The run's log streams to stdout; ``flwr list`` then
says how it ended, and the sweep reads the run folder's ``summary.json``. At the end the SuperLink
is stopped by its PID (SIGTERM, SIGKILL after a grace period); its SuperExec watches that PID
(``--parent-pid``) and exits with it, and whatever of its process tree outlives the grace period is
killed by PID (never by name).

The SuperLink inherits this process's environment and working folder: ``RAY_ADDRESS`` attaches the
runs to a Ray cluster (unset, it is set to ``local``: each run's ``flwr-simulation`` starts a Ray of its
own rather than attaching to whatever cluster a ``ray start`` left on the machine), a relative
``results-dir`` or ``data-dir`` means what it means here, and
``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` keeps it in this environment (no ``uv sync``).

A config goes to ``flwr run`` as run keys (:func:`run_config_of`: every key that fills a field of
the config), and is refused unless those keys rebuild the very same config: what runs under the
SuperLink is what the sweep planned. This module repeats a little of ``deploy.flwr_cli`` (the
environment, the connection file) and of ``deploy.processes`` (a process tree read from /proc):
``flower_apps`` may not import ``deploy`` (tests/test_import_graph.py), and those two must run alone in
the deployment images.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from flower_apps.config import Key, StudySpec

PROJECT = Path(__file__).resolve().parents[1]  # the Flower App: pyproject.toml with [tool.flwr.app]
CONNECTION = "ppfl-local"
RUN_ID = re.compile(r"Successfully started run (\d+)")
COMPLETED = "finished:completed"
# No update check, no telemetry, no dependency installation (the runs use this environment).
QUIET_ENV = {"FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0",
             "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}


def executable(name: str) -> str:
    """A Flower entry point next to this Python (the venv), else on PATH."""
    sibling = Path(sys.executable).with_name(name)
    found = str(sibling) if sibling.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} or on PATH; is flwr installed?")
    return found


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_run_key(key: Key, value: Any) -> Any:
    """A config field's value as its run key's value: the inverse of ``Key.check`` (``many``: comma-joined;
    a ``parse`` result: None from the default, a tuple comma-joined). :func:`run_config_of` checks the result."""
    if key.many or (isinstance(value, tuple) and key.type is str):
        return ",".join(str(v) for v in value)
    if value is None and key.parse is not None and key.parse(key.default) is None:
        return key.default
    return value


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, start time, state) of ``pid`` from /proc (Linux), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = raw[raw.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    return int(f[1]), int(f[19]), f[0]


def _descendants(root: int) -> list[tuple[int, int]]:
    """(pid, start time) of every live descendant of ``root`` (none where /proc is missing)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc") if Path("/proc").is_dir() else []:
        st = _stat(int(entry)) if entry.isdigit() else None
        if st is not None:
            children.setdefault(st[0], []).append((int(entry), st[1]))
    out, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child[0])
    return out


def _alive(proc: tuple[int, int]) -> bool:
    """The process runs, is no zombie and is the one seen before (same start time: a reused PID is not)."""
    st = _stat(proc[0])
    return st is not None and st[1] == proc[1] and st[2] != "Z"


def run_config_of(spec: StudySpec, cfg: Any) -> dict[str, Any]:
    """The run keys that rebuild ``cfg`` exactly: each key that fills a field of it, as ``flwr run`` takes them.

    Raises ValueError when they do not rebuild it (a field no run key can express): such a config
    cannot be submitted to a SuperLink.
    """
    from flower_apps.config import RUN_CONFIG_DEFAULTS
    from flower_apps.router import prepare

    fields = {f.name for f in dataclasses.fields(cfg)}
    keys: dict[str, Any] = {"study": spec.name}
    for key in spec.keys.keys.values():
        if key.field in fields and key.name != "study":
            keys[key.name] = _as_run_key(key, getattr(cfg, key.field))
    _, again = prepare({**RUN_CONFIG_DEFAULTS, **keys}, given=keys)
    if again != cfg:
        diff = [f for f in sorted(fields) if getattr(again, f, None) != getattr(cfg, f)]
        raise ValueError(f"study {spec.name!r}: its run keys do not rebuild this config (fields {diff} differ); "
                         "run it with engine='inprocess'")
    return keys


def _federation(num_supernodes: int, num_cpus: float, num_gpus: float) -> str:
    return f"num-supernodes={int(num_supernodes)} client-resources-num-cpus={num_cpus!r} " \
           f"client-resources-num-gpus={float(num_gpus)!r}"


@dataclasses.dataclass
class RunResult:
    """How one ``flwr run`` ended: its id, its status (``finished:completed``, ...) and its streamed log."""

    run_id: int | None
    status: str
    log: list[str]


class LocalSuperLink:
    """One local simulation SuperLink on a free port, for the runs of one sweep (a context manager)."""

    def __init__(self, project: Path = PROJECT, startup_timeout: float = 120.0, echo: bool = True) -> None:
        if not (Path(project) / "pyproject.toml").is_file():
            raise FileNotFoundError(f"{project} has no pyproject.toml: flwr run needs the project's Flower App "
                                    "(an installed wheel has none; run from the checkout or use engine='inprocess')")
        self.project = Path(project)
        self.startup_timeout = startup_timeout
        self.echo = echo
        self.port = 0
        self.popen: subprocess.Popen | None = None
        self.workdir: Path | None = None

    def __enter__(self) -> LocalSuperLink:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None, "start() first"
        return self.workdir / "superlink.log"

    def _env(self, flwr_home: Path) -> dict[str, str]:
        env = {**os.environ, **QUIET_ENV, "FLWR_HOME": str(flwr_home)}
        if not env.get("RAY_ADDRESS"):
            env["RAY_ADDRESS"] = "local"  # a Ray of each run's own, never a cluster found on the machine
        bindir = str(Path(sys.executable).parent)  # the SuperLink starts flower-superexec, flwr-simulation by name
        if bindir not in env.get("PATH", "").split(os.pathsep):
            env["PATH"] = os.pathsep.join(p for p in (bindir, env.get("PATH", "")) if p)
        return env

    def healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).is_success
        except httpx.HTTPError:
            return False

    def start(self) -> None:
        """Start the SuperLink (a few tries if another process takes the free port first) and wait until healthy."""
        self.workdir = Path(tempfile.mkdtemp(prefix="ppfl-superlink-"))
        for attempt in range(3):
            self.port = free_port()
            with open(self.log_path, "ab") as log:
                self.popen = subprocess.Popen(
                    [executable("flower-superlink"), "--insecure", "--simulation",
                     "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(self.port)],
                    env=self._env(self.workdir / "superlink-home"), cwd=os.getcwd(), stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + self.startup_timeout
            while self.popen.poll() is None and not self.healthy():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"flower-superlink not healthy after {self.startup_timeout:.0f}s; "
                                       f"log: {self.log_path}")
                time.sleep(0.3)
            if self.popen.poll() is None:
                break
            if attempt == 2:
                raise RuntimeError(f"flower-superlink exited with {self.popen.returncode}:\n"
                                   f"{self.log_path.read_text(errors='replace')[-3000:]}")
        cli = self.workdir / "cli"
        cli.mkdir()
        (cli / "config.toml").write_text(tomli_w.dumps(
            {"superlink": {"default": CONNECTION, CONNECTION: {"address": f"127.0.0.1:{self.port}", "insecure": True}}}))

    def stop(self, grace: float = 30.0) -> None:
        """Stop the SuperLink by its PID, and wait for what it started to end. Safe to call twice.

        SIGTERM to the SuperLink (SIGKILL after ``grace`` seconds); its SuperExec exits when it sees its
        parent gone, a ``flwr-simulation`` finishing a run exits with its Ray. Whatever of the tree
        (read from /proc before the signal) still runs after ``grace`` seconds is killed by PID.
        """
        if self.popen is not None and self.popen.poll() is None:
            tree = _descendants(self.popen.pid)
            self.popen.terminate()
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=grace)
            deadline = time.monotonic() + grace
            while any(_alive(p) for p in tree) and time.monotonic() < deadline:
                time.sleep(0.2)
            for proc in tree:
                if _alive(proc):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc[0], signal.SIGKILL)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def flwr(self, args: list[str], timeout: float = 120) -> str:
        """``flwr <args>`` against this SuperLink's connection; its stdout."""
        assert self.workdir is not None, "start() first"
        return subprocess.run([executable("flwr"), *args], env=self._env(self.workdir / "cli"), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL).stdout

    def status(self, run_id: int, settle: float = 60.0) -> str:
        """The run's status from ``flwr list``, waiting up to ``settle`` seconds for a terminal one."""
        deadline = time.monotonic() + settle
        while True:
            out = self.flwr(["list", CONNECTION, "--run-id", str(run_id), "--format", "json"])
            start = out.find("{")
            runs = json.loads(out[start:]).get("runs") if start >= 0 else None
            status = str((runs or [{}])[0].get("status", "unknown"))
            if status.startswith("finished") or time.monotonic() > deadline:
                return status
            time.sleep(1.0)

    def run(self, run_config: dict[str, Any], num_supernodes: int, num_cpus: float = 1,
            num_gpus: float = 0.0) -> RunResult:
        """One ``flwr run ... --stream`` with these run keys and federation options; waits for the end."""
        assert self.workdir is not None, "start() first"
        keys = self.workdir / "run-config.toml"
        keys.write_text(tomli_w.dumps(run_config))
        cmd = [executable("flwr"), "run", str(self.project), CONNECTION, "--stream", "--run-config", str(keys),
               "--federation-config", _federation(num_supernodes, num_cpus, num_gpus)]
        lines: list[str] = []
        run_id = None
        with subprocess.Popen(cmd, env=self._env(self.workdir / "cli"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if self.echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                m = RUN_ID.search(line)
                if m and run_id is None:
                    run_id = int(m.group(1))
        if run_id is None:
            return RunResult(None, f"not started (flwr run exited {proc.returncode})", lines)
        return RunResult(run_id, self.status(run_id), lines)


def run_many_on_superlink(spec: StudySpec, configs: list[Any], num_supernodes: int, num_cpus: float = 1,
                          num_gpus: float = 0.0, on_done: Callable[[Any, dict], None] | None = None,
                          echo: bool = True, link: LocalSuperLink | None = None) -> None:
    """Run ``configs`` of study ``spec`` one ``flwr run`` each on ONE local SuperLink; ``on_done(cfg, summary)``.

    ``link``: a started SuperLink to use (and leave running); default: one of its own, stopped at the end.

    A run that another process finished meanwhile, or whose folder another process is writing (a second
    sweep over an overlapping grid), is skipped, as in-process. Any other failed run raises RuntimeError
    (the runs before it are written: a rerun resumes).
    """
    from flower_apps.common.results import read_json, run_finished, run_folder

    submitted = [(cfg, run_config_of(spec, cfg)) for cfg in configs]  # every refusal before any run
    own = link is None
    link = LocalSuperLink(echo=echo) if link is None else link
    try:
        if own:
            link.start()
        for cfg, keys in submitted:
            folder = run_folder(spec.name, cfg)
            if run_finished(folder, cfg) and getattr(cfg, "rerun", "refuse") != "replace":
                print(f"skipped: run folder {folder} holds a finished run of this config", flush=True)
                continue
            res = link.run(keys, num_supernodes, num_cpus, num_gpus)
            if res.status != COMPLETED:
                text = "".join(res.log)
                if "is being written by another process" in text or \
                        (run_finished(folder, cfg) and "RunFinished" in text):
                    print(f"skipped: {folder} (another process writes or wrote it)", flush=True)
                    continue
                tail = "" if link.echo else "\n" + "".join(res.log[-40:])
                raise RuntimeError(f"{spec.name} run {folder.name}: flwr run {res.run_id} ended {res.status}; "
                                   f"its log is above{tail}")
            if on_done:
                on_done(cfg, read_json(folder / "summary.json"))
    finally:
        if own:
            link.stop()
