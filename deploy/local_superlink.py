"""The local SuperLink that ``flwr run`` starts: which port it uses, and stopping *yours* only.

What flwr 1.42 does (``flwr/cli/constant.py``, ``flwr/cli/local_superlink.py``): a connection whose
address is ``:local:`` (the default ``local`` one) is served by a ``flower-superlink --insecure
--simulation`` on ``127.0.0.1:$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT`` (default 39091). ``flwr`` first
asks ``http://127.0.0.1:<port>/health`` and starts a SuperLink only if nothing answers, so whatever
answers there, *whoever's it is*, gets the run. The port does not depend on ``FLWR_HOME`` (which
only holds that SuperLink's ``local-superlink/state.db`` and ``superlink.log``). On a shared machine
give each user (and each parallel test session) its own port.

    python -m deploy.local_superlink port   # the port this shell's `flwr run` uses
    python -m deploy.local_superlink stop   # stop this user's flower-superlink listening on it

``stop`` reads ``/proc`` (Linux): it signals only a ``flower-superlink`` process of the calling user
that listens on that port (and the processes it started), never another user's or another port's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from deploy.processes import Proc, identify, stop_tree

PORT_ENV = "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"
DEFAULT_PORT = 39091  # flwr 1.42 flwr/cli/constant.py; pinned by tests/deploy/test_deploy_local_superlink.py
LISTEN = "0A"  # TCP state in /proc/net/tcp{,6}


def local_port(env: dict[str, str] | None = None) -> int:
    """The port ``flwr run`` probes and starts its local SuperLink on, as flwr 1.42 reads it."""
    raw = (os.environ if env is None else env).get(PORT_ENV, str(DEFAULT_PORT))
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"{PORT_ENV} must be a port number, got {raw!r}") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"{PORT_ENV} must be in [1, 65535], got {port}")
    return port


def _listening_inodes(port: int, uid: int) -> set[str]:
    """Socket inodes of TCP listeners on ``port`` owned by ``uid`` (IPv4 and IPv6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == LISTEN and int(f[7]) == uid:
                inodes.add(f[9])
    return inodes


def superlinks_on(port: int) -> list[Proc]:
    """This user's ``flower-superlink`` processes listening on ``port``."""
    if not Path("/proc/net/tcp").exists():
        raise OSError("needs /proc (Linux); elsewhere: kill $(lsof -t -a -u \"$USER\" "
                      f"-iTCP:{port} -sTCP:LISTEN) after checking it is your flower-superlink")
    sockets = {f"socket:[{i}]" for i in _listening_inodes(port, os.getuid())}
    found = []
    for entry in os.listdir("/proc") if sockets else []:
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            fds = {os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")}
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # gone, or another user's
        if fds & sockets and any(Path(a.decode(errors="replace")).name == "flower-superlink" for a in cmd[:2]):
            proc = identify(int(entry))
            if proc is not None:
                found.append(proc)
    return found


def stop(port: int, grace: float = 10.0) -> list[Proc]:
    """SIGTERM this user's SuperLink on ``port`` and what it started (SIGKILL after ``grace``)."""
    procs = superlinks_on(port)
    if procs:
        stop_tree(procs, grace=grace)
    return procs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.local_superlink", description=__doc__.split("\n")[0])
    p.add_argument("cmd", choices=["port", "stop"])
    p.add_argument("--port", type=int, help=f"default: ${PORT_ENV} or {DEFAULT_PORT}, as flwr reads it")
    args = p.parse_args(argv)
    port = args.port or local_port()
    if args.cmd == "port":
        print(port)
        return 0
    stopped = stop(port)
    if not stopped:
        print(f"no flower-superlink of yours listens on port {port}", file=sys.stderr)
        return 1
    print(f"stopped flower-superlink (pid {', '.join(str(pid) for pid, _ in stopped)}) on port {port}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
