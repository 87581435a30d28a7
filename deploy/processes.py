"""Start and stop long-running processes by PID, with their whole process tree (Linux).

Flower's daemons spawn helpers in *new sessions* (``flower-superlink`` starts its SuperExec
with ``start_new_session=True``, which starts ``flwr-serverapp``); Ray's ``ray start`` daemonizes
its raylet and GCS. Killing a process group therefore misses processes, and killing only the
parent can orphan them. :func:`stop_tree` snapshots every descendant (through /proc) before
signalling anything, then terminates them by PID, escalating to SIGKILL after a grace period.
A PID is identified together with its start time, so a reused PID is never signalled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot): unique for the boot


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, start time) of ``pid`` from /proc, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(")") + 2:].split()
    return int(fields[1]), int(fields[19])  # ppid (field 4), starttime (field 22)


def identify(pid: int) -> Proc | None:
    """(pid, start time) of a live process, or None."""
    st = _stat(pid)
    return None if st is None else (pid, st[1])


def is_alive(proc: Proc) -> bool:
    """True if ``proc`` runs and is not a zombie (a reused PID does not count)."""
    st = _stat(proc[0])
    if st is None or st[1] != proc[1]:
        return False
    try:
        state = Path(f"/proc/{proc[0]}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def descendants(root: int) -> list[Proc]:
    """Every live descendant of ``root`` (children first in no particular order)."""
    children: dict[int, list[Proc]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                children.setdefault(st[0], []).append((int(entry), st[1]))
    out: list[Proc] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child[0])
    return out


def tree(root: Proc) -> list[Proc]:
    """``root`` and its live descendants."""
    return ([root] if is_alive(root) else []) + (descendants(root[0]) if is_alive(root) else [])


def _signal(proc: Proc, sig: int) -> None:
    if is_alive(proc):
        try:
            os.kill(proc[0], sig)
        except ProcessLookupError:
            pass


def stop_tree(roots: Iterable[Proc], grace: float = 8.0, sig: int = signal.SIGTERM) -> list[Proc]:
    """Stop ``roots`` and all their descendants; return the processes that had to be SIGKILLed.

    Descendants are collected before and after the graceful signal (daemons may spawn while
    shutting down), so nothing started by a root survives it; whatever still runs after
    ``grace`` seconds is SIGKILLed.
    """
    roots = list(roots)
    seen: dict[int, Proc] = {}
    for r in roots:
        for p in tree(r):
            seen[p[0]] = p
    # Signal every process, not only the roots: a helper in its own session (SuperExec) only
    # notices its parent's death by polling, which would cost the whole grace period.
    for p in list(seen.values()):
        _signal(p, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        for p in list(seen.values()):
            for d in descendants(p[0]) if is_alive(p) else []:
                seen.setdefault(d[0], d)
        if not any(is_alive(p) for p in seen.values()):
            return []
        time.sleep(0.1)
    killed = [p for p in seen.values() if is_alive(p)]
    for p in killed:
        _signal(p, signal.SIGKILL)
    for p in killed:  # reap our own children; others are reaped by init
        try:
            os.waitpid(p[0], os.WNOHANG)
        except ChildProcessError:
            pass
    return killed


def kill_tree(root: Proc) -> None:
    """SIGKILL ``root`` and its descendants at once (a crash: no graceful shutdown)."""
    procs = tree(root)
    for p in procs:
        _signal(p, signal.SIGSTOP)  # freeze first so nothing respawns or reparents mid-kill
    for p in procs:
        _signal(p, signal.SIGKILL)


_HANDED_OUT: set[int] = set()  # every port free_port returned in this process


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, read, close), never one this process was given
    before: the OS may offer a just-closed port again, and a caller that asks for several ports before
    starting anything (a Ray node's 20-odd ports, a head and a worker node) needs them distinct. Seen: a Ray
    head refusing ``--worker-port-list`` with the same port twice."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no port on {host} that this process has not handed out already (1000 tries)")


@dataclass
class Managed:
    """A process started by :func:`start`, its log file and identity."""

    name: str
    cmd: list[str]
    log: Path
    popen: subprocess.Popen
    proc: Proc

    @property
    def pid(self) -> int:
        return self.proc[0]

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log (for failure messages)."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def start(name: str, cmd: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
          cwd: str | Path | None = None) -> Managed:
    """Start ``cmd`` in its own session, stdout+stderr to ``log`` (Ctrl-C in a terminal spares it)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        popen = subprocess.Popen(list(cmd), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True)
    proc = identify(popen.pid) or (popen.pid, -1)
    return Managed(name, list(cmd), log, popen, proc)


@dataclass
class ProcessSet:
    """Processes to tear down together, newest first."""

    items: list[Managed] = field(default_factory=list)

    def add(self, m: Managed) -> Managed:
        self.items.append(m)
        return m

    def stop_all(self, grace: float = 8.0) -> list[Proc]:
        killed = stop_tree([m.proc for m in reversed(self.items)], grace=grace)
        for m in self.items:
            try:
                m.popen.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        return killed

    def report(self, lines: int = 40) -> str:
        """Tails of every log, for assertion messages."""
        return "\n".join(f"----- {m.name} (pid {m.pid}, {'running' if m.alive() else f'exit {m.popen.returncode}'})"
                         f" {m.log} -----\n{m.tail(lines)}" for m in self.items)
