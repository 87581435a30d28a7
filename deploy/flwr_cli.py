"""Thin wrappers around the ``flwr`` CLI (1.42): connections, SuperNode registration, runs.

Every function takes the ``FLWR_HOME`` whose ``config.toml`` holds the SuperLink connections,
so tests and scripts never touch the user's ``~/.flwr``.

    python -m deploy.flwr_cli connection --flwr-home ~/.flwr --name mylink \\
        --address flower.example.org:8000 --root-certificates certs/ca.crt
    python -m deploy.flwr_cli register --list certs/authorized_supernodes.pub --superlink mylink
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tomli_w

# Environment for every Flower process started by these helpers: no update check, no
# telemetry (nothing may leave a study's machines unasked), and no `uv sync` of the app's
# dependencies: processes run in the environment they were started from (see docs/deployment.md).
QUIET_ENV = {
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
TERMINAL = ("finished:completed", "finished:failed", "finished:stopped")
ALREADY_REGISTERED = "Public key already in use"  # flwr 1.42 ApiErrorCode.PUBLIC_KEY_ALREADY_IN_USE


class FlwrCliError(RuntimeError):
    """A ``flwr`` command failed; the message carries its output."""


def executable(name: str) -> str:
    """Path of a Flower entry point: next to this Python first (the venv), else on PATH."""
    sibling = Path(sys.executable).with_name(name)
    if sibling.exists():
        return str(sibling)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} or on PATH; is flwr installed?")
    return found


def flower_env(flwr_home: str | Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ + QUIET_ENV + FLWR_HOME (+ ``extra``), with this Python's bin directory first on PATH.

    Flower's processes start their children by bare name (the SuperLink and the SuperNode spawn
    ``flower-superexec``, the SuperExec spawns ``flwr-serverapp``/``flwr-clientapp``), so an
    environment that was not activated (``.venv/bin/python -m pytest``) would make them fail with
    ``FileNotFoundError: 'flower-superexec'`` long after start.
    """
    env = {**os.environ, **QUIET_ENV, "FLWR_HOME": str(flwr_home), **(extra or {})}
    bindir = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if bindir not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join([bindir, path]) if path else bindir
    return env


#: flwr 1.42's own entry for the local SuperLink that a plain ``flwr run .`` starts (flwr/cli/constant.py,
#: DEFAULT_FLOWER_CONFIG_TOML: ``[superlink.local] address = ":local:"``, the default connection)
LOCAL_CONNECTION = {"address": ":local:"}


def write_connection(flwr_home: str | Path, name: str, address: str, root_certificates: str | Path | None = None,
                     insecure: bool = False, default: bool = False) -> Path:
    """Add (or replace) ``[superlink.<name>]`` in ``<flwr_home>/config.toml``, keeping flwr's ``local`` entry.

    The file keeps (or gets, when this writes it first) flwr's own ``[superlink.local]`` entry and its
    default connection (``local`` on a new file), so a plain ``flwr run .`` still means the local SuperLink
    and never a federation or cluster this wrote; ``default=True`` (``--default``) makes ``name`` the
    default on purpose. Refuses to write over ``local`` itself.
    """
    if name == "local":
        raise ValueError("'local' is flwr's own connection to the local SuperLink; name yours otherwise")
    if root_certificates is None and not insecure:
        raise ValueError("a TLS connection needs root_certificates (or pass insecure=True)")
    path = Path(flwr_home) / "config.toml"
    data: dict[str, Any] = {}
    if path.exists():
        import tomllib

        data = tomllib.loads(path.read_text())
    if not data:  # a new file: what flwr 1.42 writes on first use (flwr/cli/constant.py, DEFAULT_FLOWER_CONFIG_TOML)
        data = {"superlink": {"default": "local", "supergrid": {"address": "api.flower.ai"}}}
    links = data.setdefault("superlink", {})
    links.setdefault("local", dict(LOCAL_CONNECTION))
    links.setdefault("default", "local")
    conn: dict[str, Any] = {"address": address}
    if insecure:
        conn["insecure"] = True
    else:
        conn["root-certificates"] = str(Path(root_certificates).resolve())  # type: ignore[arg-type]
    links[name] = conn
    if default:
        links["default"] = name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(data))
    return path


def config_args(values: Mapping[str, Any]) -> str:
    """``{'preset': 'smoke', 'seed': 1}`` -> ``"preset='smoke' seed=1"`` (flwr's override syntax)."""
    parts = []
    for key, val in values.items():
        if isinstance(val, bool):
            parts.append(f"{key}={'true' if val else 'false'}")
        elif isinstance(val, (int, float)):
            parts.append(f"{key}={val!r}")
        elif isinstance(val, str):
            if "'" in val:
                raise ValueError(f"{key}: values cannot contain a single quote, got {val!r}")
            parts.append(f"{key}='{val}'")
        else:
            raise ValueError(f"{key}: only bool, int, float and str are allowed, got {type(val).__name__}")
    return " ".join(parts)


def flwr(args: list[str], flwr_home: str | Path, cwd: str | Path | None = None, timeout: float = 120,
         env: Mapping[str, str] | None = None) -> str:
    """Run ``flwr <args>`` and return stdout; raise FlwrCliError with stdout+stderr on failure."""
    cmd = [executable("flwr"), *args]
    try:
        res = subprocess.run(cmd, cwd=cwd, env=flower_env(flwr_home, env), capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        # on POSIX, run() re-raises communicate()'s TimeoutExpired, whose stdout / stderr are the raw bytes read
        # so far (or None) even with text=True: decode them so the message shows text, not b'...'
        out, err = (x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (exc.stdout, exc.stderr))
        raise FlwrCliError(f"`flwr {' '.join(args)}` timed out after {timeout:.0f}s\n{out}\n{err}") from exc
    if res.returncode != 0:
        raise FlwrCliError(f"`flwr {' '.join(args)}` exited {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}")
    return res.stdout


def _json(out: str) -> dict:
    start = out.find("{")
    if start < 0:
        raise FlwrCliError(f"no JSON in flwr output:\n{out}")
    data = json.loads(out[start:])
    if not data.get("success", False):
        raise FlwrCliError(f"flwr reported failure:\n{out}")
    return data


def register_supernode(public_key: str | Path, superlink: str, flwr_home: str | Path) -> int:
    """``flwr supernode register <public_key> <superlink>``; returns the new node id."""
    data = _json(flwr(["supernode", "register", str(public_key), superlink, "--format", "json"], flwr_home))
    return int(data["node-id"])


def register_list(list_file: str | Path, superlink: str, flwr_home: str | Path,
                  skip_registered: bool = False) -> dict[str, int | None]:
    """Register every OpenSSH public-key line of ``list_file``; returns {key comment: node id}.

    With ``skip_registered`` a key the SuperLink already knows ("Public key already in use")
    maps to None instead of failing, so a re-run against a persistent SuperLink is harmless.
    """
    ids: dict[str, int | None] = {}
    lines = [ln.strip() for ln in Path(list_file).read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    if not lines:
        raise ValueError(f"{list_file} holds no public keys")
    with tempfile.TemporaryDirectory() as tmp:
        for i, line in enumerate(lines):
            name = line.split()[2] if len(line.split()) > 2 else f"key-{i}"
            key = Path(tmp) / f"{i}.pub"
            key.write_text(line + "\n")
            try:
                ids[name] = register_supernode(key, superlink, flwr_home)
            except FlwrCliError as exc:
                if not (skip_registered and ALREADY_REGISTERED in str(exc)):
                    raise
                ids[name] = None
    return ids


def list_supernodes(superlink: str, flwr_home: str | Path) -> list[dict]:
    """``flwr supernode list``: one dict per node (node-id, status, ...)."""
    return list(_json(flwr(["supernode", "list", superlink, "--format", "json"], flwr_home))["nodes"])


def start_run(app_dir: str | Path, superlink: str, flwr_home: str | Path, run_config: Mapping[str, Any] | None = None,
              federation_config: Mapping[str, Any] | None = None, timeout: float = 180) -> int:
    """``flwr run <app_dir> <superlink> --run-config ...``; returns the run id (the run goes on)."""
    args = ["run", str(app_dir), superlink, "--format", "json"]
    if run_config:
        args += ["--run-config", config_args(run_config)]
    if federation_config:
        args += ["--federation-config", config_args(federation_config)]
    return int(_json(flwr(args, flwr_home, cwd=app_dir, timeout=timeout))["run-id"])


def run_info(run_id: int, superlink: str, flwr_home: str | Path) -> dict:
    """``flwr list --run-id``: status ('running', 'finished:completed', ...), timings, traffic."""
    runs = _json(flwr(["list", superlink, "--run-id", str(run_id), "--format", "json"], flwr_home))["runs"]
    return dict(runs[0])


def run_log(run_id: int, superlink: str, flwr_home: str | Path, timeout: float = 30) -> str:
    """The run's logs so far (``flwr log <id> --show``; ServerApp output)."""
    try:
        return flwr(["log", str(run_id), superlink, "--show"], flwr_home, timeout=timeout)
    except FlwrCliError as exc:
        return f"(flwr log failed: {exc})"


def wait_run(run_id: int, superlink: str, flwr_home: str | Path, timeout: float,
             done: Callable[[], bool] | None = None, status_every: float = 20.0) -> dict:
    """Wait until the run reaches a terminal status; returns its info. Raises TimeoutError.

    Each status query is a ``flwr list`` (a Python start-up, ~1-2 s of CPU), so it is asked
    every ``status_every`` seconds only; ``done`` (cheap, e.g. "summary.json exists") is
    checked twice a second, and once it holds the status is polled every 2 s.
    """
    deadline = time.monotonic() + timeout
    next_status = time.monotonic()
    while True:
        finished = done is not None and done()
        if finished or time.monotonic() >= next_status:
            info = run_info(run_id, superlink, flwr_home)
            if info["status"] in TERMINAL:
                return info
            next_status = time.monotonic() + (2.0 if finished else status_every)
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} not finished after {timeout:.0f}s")
        time.sleep(0.5 if not finished else 2.0)


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m deploy.flwr_cli`` argument parser (also used to check docker/compose.yaml)."""
    p = argparse.ArgumentParser(prog="python -m deploy.flwr_cli", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("connection", help="write a SuperLink connection into <flwr-home>/config.toml")
    c.add_argument("--flwr-home", default=os.environ.get("FLWR_HOME", str(Path.home() / ".flwr")))
    c.add_argument("--name", required=True)
    c.add_argument("--address", required=True, help="host:port of the SuperLink")
    c.add_argument("--root-certificates", help="CA certificate (omit only with --insecure)")
    c.add_argument("--insecure", action="store_true")
    c.add_argument("--default", action="store_true",
                   help="make it the default connection (a plain `flwr run .` then targets it; else `local` stays)")
    r = sub.add_parser("register", help="register every public key of an authorized_supernodes.pub list")
    r.add_argument("--flwr-home", default=os.environ.get("FLWR_HOME", str(Path.home() / ".flwr")))
    r.add_argument("--list", required=True)
    r.add_argument("--superlink", required=True, help="connection name in config.toml")
    r.add_argument("--skip-registered", action="store_true", help="keys the SuperLink already knows are not an error")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "connection":
        path = write_connection(args.flwr_home, args.name, args.address, args.root_certificates, args.insecure,
                                args.default)
        import tomllib

        default = tomllib.loads(path.read_text())["superlink"]["default"]
        print(f"{path}: connection {args.name!r} written; default connection: {default!r}"
              + ("" if default == args.name else f" (flwr run . {args.name} ... targets it)"))
    else:
        for name, node_id in register_list(args.list, args.superlink, args.flwr_home, args.skip_registered).items():
            print(f"{name}: " + (f"node id {node_id}" if node_id is not None else "already registered"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
