"""A real Flower 1.42 deployment on loopback: one SuperLink (TLS, SuperNode auth) and N SuperNodes.

The same processes, flags and files as a multi-machine deployment (docs/deployment.md), on
127.0.0.1 with free ports and a private FLWR_HOME/HOME, so a test or a curious user can see
the Deployment Engine end to end without Docker. Every process is started in its own session
and torn down by PID with its whole process tree (deploy.processes), whatever happens.

    python -m deploy.local_federation --supernodes 3 --run "preset='smoke'"   # run once, tear down
    python -m deploy.local_federation --supernodes 3                         # stay up until Ctrl-C
    python -m deploy.local_federation --supernodes 2 --data DIR --run "study='dfl-dp' preset='smoke' \
        node-local-data=true eval-data-path='DIR/coordinator/dfl-dp/eval.npz'"  # node-local (deploy.export)
"""

from __future__ import annotations

import argparse
import re
import signal
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from deploy import certs, flwr_cli
from deploy.processes import Managed, ProcessSet, free_port, kill_tree, start

REPO = Path(__file__).resolve().parents[1]
CONNECTION = "local-deployment"


@dataclass
class SuperNodeHandle:
    """One SuperNode process and what identifies it at the SuperLink."""

    name: str
    node_id: int | None  # None for a key that was never registered
    node_config: dict[str, Any]
    process: Managed


def default_node_config(index: int, total: int, workdir: Path) -> dict[str, Any]:
    """``partition-id``/``num-partitions`` (simulated partitions: every node carves its part out of the dataset).

    A node-local deployment sets ``data-path`` (and ``node-name``) instead: see
    :func:`node_local_config` and docs/deployment.md.
    """
    return {"partition-id": index, "num-partitions": total}


def node_local_config(data_root: str | Path) -> Callable[[int, int, Path], dict[str, Any]]:
    """SuperNode i's node config: ``data-path=<data_root>/node-<i>``, ``node-name=node-<i>`` (deploy.export)."""
    root = Path(data_root).resolve()
    return lambda i, total, workdir: {"data-path": str(root / f"node-{i}"), "node-name": f"node-{i}"}


class LocalFederation:
    """Start/stop a loopback federation. Use as a context manager: teardown always runs.

    Parameters
    ----------
    workdir : directory for certificates, keys, logs and every process's FLWR_HOME/HOME.
    num_supernodes : SuperNodes to register and start.
    app_dir : the Flower App (this repository by default).
    node_config : (index, total, workdir) -> the SuperNode's --node-config values.
    """

    def __init__(self, workdir: str | Path, num_supernodes: int = 3, app_dir: str | Path = REPO,
                 node_config: Callable[[int, int, Path], dict[str, Any]] = default_node_config,
                 startup_timeout: float = 120.0, isolation: str = "process",
                 node_env: Callable[[int, Path], dict[str, str]] | None = None) -> None:
        if num_supernodes < 1:
            raise ValueError(f"num_supernodes must be >= 1, got {num_supernodes}")
        if isolation not in ("process", "subprocess"):
            raise ValueError(f"isolation must be 'process' or 'subprocess', got {isolation!r}")
        self.isolation = isolation
        self.workdir = Path(workdir).resolve()
        self.num_supernodes = num_supernodes
        self.app_dir = Path(app_dir).resolve()
        self.node_config = node_config
        self.node_env = node_env  # (index, workdir) -> extra environment of SuperNode ``index``
        self.startup_timeout = startup_timeout
        self.procs = ProcessSet()
        self.supernodes: dict[str, SuperNodeHandle] = {}
        self.port = 0
        self.cli_home = self.workdir / "cli"
        self.tls: certs.TlsFiles | None = None
        self.keys: list[certs.NodeKey] = []

    # ----------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> LocalFederation:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self, name: str) -> dict[str, str]:
        """Environment of one process: private HOME and FLWR_HOME, no telemetry, no `uv sync`."""
        home = self.workdir / name / "home"
        home.mkdir(parents=True, exist_ok=True)
        return flwr_cli.flower_env(home / ".flwr", {"HOME": str(home)})

    def start(self) -> None:
        """Certificates, SuperLink, registration of the keys, SuperNodes; waits until all are online."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tls, self.keys = certs.write_all(self.workdir / "certs", ["localhost"], self.num_supernodes)
        self.port = free_port()
        secret = self.workdir / "certs" / certs.SUPEREXEC_SECRET
        isolation = (["--isolation", "process", "--superexec-auth-secret-file", str(secret)]
                     if self.isolation == "process" else ["--isolation", "subprocess"])
        self.procs.add(start("superlink", [
            flwr_cli.executable("flower-superlink"),
            "--ssl-ca-certfile", str(self.tls.ca_cert), "--ssl-certfile", str(self.tls.server_cert),
            "--ssl-keyfile", str(self.tls.server_key),
            "--enable-supernode-auth",
            *isolation,
            "--disable-runtime-dependency-installation",
            "--host", "127.0.0.1", "--port", str(self.port),
        ], self.workdir / "superlink" / "superlink.log", env=self.env("superlink")))
        self._wait_superlink()
        if self.isolation == "process":
            # The SuperLink runs no app code: this SuperExec (the project's environment) pulls
            # ServerApp tasks from the Runtime API and runs them, as the Docker setup does.
            self.procs.add(start("serverapp-superexec", [
                flwr_cli.executable("flower-superexec"),
                "--runtime-api-address", f"127.0.0.1:{self.port}",
                "--root-certificates", str(self.tls.ca_cert),
                "--superexec-auth-secret-file", str(secret),
            ], self.workdir / "serverapp-superexec" / "superexec.log", env=self.env("serverapp-superexec")))
        flwr_cli.write_connection(self.cli_home, CONNECTION, f"127.0.0.1:{self.port}", self.tls.ca_cert)
        # The operator registers each institution's public key (`flwr supernode register`).
        with ThreadPoolExecutor(max_workers=4) as pool:
            node_ids = list(pool.map(lambda k: flwr_cli.register_supernode(k.public_key, CONNECTION, self.cli_home),
                                     self.keys))
        for i, (key, node_id) in enumerate(zip(self.keys, node_ids)):
            cfg = self.node_config(i, self.num_supernodes, self.workdir)
            env = self.node_env(i, self.workdir) if self.node_env else None
            self.supernodes[key.name] = SuperNodeHandle(key.name, node_id, cfg,
                                                        self.start_supernode(key.name, key.private_key, cfg,
                                                                             env=env))
        self.wait_online(list(self.supernodes.values()))

    def start_supernode(self, name: str, private_key: Path, node_config: Mapping[str, Any],
                        extra_args: list[str] | None = None, env: Mapping[str, str] | None = None) -> Managed:
        """Start one ``flower-supernode`` (TLS to the SuperLink, authenticated with ``private_key``)."""
        assert self.tls is not None, "start() first"
        return self.procs.add(start(name, [
            flwr_cli.executable("flower-supernode"),
            "--superlink", f"127.0.0.1:{self.port}",
            "--root-certificates", str(self.tls.ca_cert),
            "--auth-supernode-private-key", str(private_key),
            "--node-config", flwr_cli.config_args(node_config),
            "--port", str(free_port()),  # this SuperNode's Runtime API (its ClientApps connect here)
            *(extra_args or []),
        ], self.workdir / name / f"{name}.log", env={**self.env(name), **(env or {})}))

    def stop(self) -> None:
        """Stop every process started here (whole trees, by PID), SIGKILL after a grace period."""
        self.procs.stop_all()

    # ----------------------------------------------------------------------------- waiting
    def _wait_superlink(self) -> None:
        assert self.tls is not None
        ctx = ssl.create_default_context(cafile=str(self.tls.ca_cert))
        deadline = time.monotonic() + self.startup_timeout
        superlink = self.procs.items[0]
        while time.monotonic() < deadline:
            if not superlink.alive():
                raise RuntimeError(f"flower-superlink exited with {superlink.popen.returncode}\n{superlink.tail()}")
            try:
                if httpx.get(f"https://127.0.0.1:{self.port}/health", verify=ctx, timeout=2).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"SuperLink not healthy after {self.startup_timeout:.0f}s\n{superlink.tail()}")

    def node_status(self) -> dict[int, str]:
        """node id -> status ('registered', 'online', 'offline') as the SuperLink reports it."""
        return {int(n["node-id"]): n["status"] for n in flwr_cli.list_supernodes(CONNECTION, self.cli_home)}

    def wait_online(self, handles: list[SuperNodeHandle]) -> None:
        """Wait until every SuperNode logged its activation, then confirm with the SuperLink.

        Reading the logs avoids polling ``flwr supernode list`` (a CLI start each time).
        """
        deadline = time.monotonic() + self.startup_timeout
        for h in handles:
            self.wait_for_log(h.process, rf"SuperNode ID: {h.node_id}\b", max(1.0, deadline - time.monotonic()))
        # Any keys: a handle of a never-registered key has node_id None, which .get simply finds absent (offline)
        status: dict[Any, str] = self.node_status()
        offline = {h.name: status.get(h.node_id) for h in handles if status.get(h.node_id) != "online"}
        if offline:
            raise RuntimeError(f"SuperNodes not online at the SuperLink: {offline}\n{self.report()}")

    @staticmethod
    def wait_for_log(proc: Managed, pattern: str, timeout: float, after: int = 0) -> re.Match:
        """Wait until ``pattern`` (regex) appears in ``proc``'s log past character ``after``."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(proc.log_text(), after)
            if m:
                return m
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited before logging {pattern!r}\n{proc.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{proc.name} did not log {pattern!r} within {timeout:.0f}s\n{proc.tail()}")
            time.sleep(0.2)

    # ----------------------------------------------------------------------------- actions
    def run(self, run_config: Mapping[str, Any] | None = None) -> int:
        """``flwr run <app> <connection> --run-config ...``; returns the run id."""
        return flwr_cli.start_run(self.app_dir, CONNECTION, self.cli_home, run_config)

    def wait(self, run_id: int, timeout: float, done: Callable[[], bool] | None = None) -> dict:
        """Wait for a terminal run status (see flwr_cli.wait_run); returns the run info."""
        return flwr_cli.wait_run(run_id, CONNECTION, self.cli_home, timeout, done)

    def crash_supernode(self, name: str) -> None:
        """SIGKILL a SuperNode and its ClientApps: no graceful deactivation reaches the SuperLink."""
        kill_tree(self.supernodes[name].process.proc)

    def report(self, run_id: int | None = None, lines: int = 40) -> str:
        """Tails of every process log (+ the run's ServerApp log), for failure messages."""
        out = self.procs.report(lines)
        if run_id is not None:
            log = flwr_cli.run_log(run_id, CONNECTION, self.cli_home)
            out += f"\n----- flwr log {run_id} (ServerApp) -----\n" + "\n".join(log.splitlines()[-2 * lines:])
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.local_federation", description=__doc__.split("\n")[0])
    p.add_argument("--supernodes", type=int, default=3)
    p.add_argument("--workdir", help="default: a new temporary directory")
    p.add_argument("--app", default=str(REPO), help="Flower App directory")
    p.add_argument("--run", help="run config overrides, e.g. \"preset='smoke'\"; run once, then tear down")
    p.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the run")
    p.add_argument("--data", help="a `python -m deploy.export` folder: SuperNode i gets data-path=<data>/node-<i>")
    args = p.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ppfl-federation-"))
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # `with` below then tears everything down
    node_config = node_local_config(args.data) if args.data else default_node_config
    with LocalFederation(workdir, args.supernodes, args.app, node_config=node_config) as fed:
        print(f"SuperLink https://127.0.0.1:{fed.port}, {args.supernodes} SuperNodes online; logs in {workdir}")
        print(f"  FLWR_HOME={fed.cli_home} flwr run {args.app} {CONNECTION} --stream")
        if args.run:
            from strategies.flwr_adapter import parse_run_config

            run_id = fed.run(parse_run_config([args.run]))
            print(f"run {run_id} started; waiting")
            info = fed.wait(run_id, args.timeout)
            print(flwr_cli.run_log(run_id, CONNECTION, fed.cli_home))
            print(f"run {run_id}: {info['status']} {info.get('status-details', '')}")
            return 0 if info["status"] == "finished:completed" else 1
        print("Ctrl-C to stop")
        try:
            while True:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    raise SystemExit(main())
