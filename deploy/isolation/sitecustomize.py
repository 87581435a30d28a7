"""Loaded by every Python process of a SuperNode started with this folder on PYTHONPATH (a rehearsal aid).

Installs an audit hook (PEP 578, ``sys.addaudithook``) that refuses any ``open`` of a path under
one of the ``PPFL_DATA_DENY`` roots (os.pathsep-separated) unless it lies under ``PPFL_DATA_ALLOW``
(the node's own data-path), and appends one line per refusal to ``PPFL_DATA_AUDIT_LOG``. It also
appends ``installed <pid>`` there, so a test can tell that the hook really ran in the ClientApps.

Whom it protects against: a bug or a misconfiguration that would make a node's ClientApp read
another institution's folder or the central dataset during a rehearsal on one machine. It is not
a sandbox against hostile code (audit hooks can be bypassed from C); across machines the data
simply is not there.
"""

import os
import sys


def _install() -> None:
    deny = [os.path.realpath(p) for p in os.environ.get("PPFL_DATA_DENY", "").split(os.pathsep) if p]
    allow = os.path.realpath(os.environ.get("PPFL_DATA_ALLOW", "") or "/nonexistent-allow")
    log = os.environ.get("PPFL_DATA_AUDIT_LOG", "")
    if not deny or not log:
        return

    def under(path: str, root: str) -> bool:
        return path == root or path.startswith(root.rstrip(os.sep) + os.sep)

    def write(line: str) -> None:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # not refused: log is not under deny
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    busy: list[int] = []

    def hook(event: str, args: tuple) -> None:
        if event != "open" or busy or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        busy.append(1)  # our own os.open/realpath must not re-enter
        try:
            path = os.path.realpath(os.fsdecode(args[0]))
            if any(under(path, d) for d in deny) and not under(path, allow):
                write(f"refused {os.getpid()} {path}")
                raise PermissionError(f"isolation: this SuperNode may read only {allow}, not {path}")
        finally:
            busy.pop()

    write(f"installed {os.getpid()} {' '.join(sys.argv[:1])}")
    sys.addaudithook(hook)


_install()
