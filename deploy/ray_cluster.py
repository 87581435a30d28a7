"""Point Flower simulations at an existing Ray cluster, and a loopback cluster to try it on.

How flwr 1.42 reaches a Ray cluster (read from flwr/server/superlink/fleet/vce/backend/raybackend.py
and flwr/simulation/app.py):

- ``flwr run``: the federation config (``--federation-config`` / ``flwr federation
  simulation-config``) only carries ``init-args-num-cpus``, ``-num-gpus``, ``-logging-level``
  and ``-log-to-driver``; there is no address key. The RayBackend calls
  ``ray.init(**init_args)`` in the ``flwr-simulation`` process, which the SuperLink's SuperExec
  starts with the SuperLink's environment, so ``RAY_ADDRESS=<head>:<port>`` in the environment
  of ``flower-superlink --simulation`` attaches every simulation run to that cluster.
  Leave ``init-args-num-cpus/-num-gpus`` unset then: Ray refuses them for an existing cluster.
  A sweep's ``--engine superlink`` (``flower_apps.superlink``) starts its SuperLink with this process's
  environment, so ``RAY_ADDRESS=<head>:<port> python -m flower_apps.<study>.sweep --engine superlink``
  runs there.
- In-process (the adapter ``flower_apps.engine`` around the deprecated ``run_simulation``):
  ``backend_config = {"init_args": {"address": "<head>:<port>"}, "client_resources": {...}}`` is
  passed to ``ray.init`` verbatim (:func:`cluster_backend_config`, :func:`simulate_on_cluster`).

Every Ray node needs the same Python environment with this project installed: the ClientApp
actors import ``flower_apps`` on whichever node Ray places them.

Security: Ray has no authentication by default (``RAY_AUTH_MODE`` unset). Whoever reaches a node's
GCS, raylet, object-manager, client-server or dashboard ports can run code on every node as the
user that runs Ray (so read any file it can, a ``noise-seed-file`` included) and read every object in
the object store (models, updates). Keep a cluster on a private, firewalled network.
``--node-ip-address 127.0.0.1`` does not keep Ray 2.x on loopback: measured with Ray 2.55.1, the
GCS and raylet of this module's "loopback" cluster listen on every interface (``*:<port>``) and
the runtime-env agent on the host's external address.

    python -m deploy.ray_cluster --workers 1 --run "preset='smoke'"    # loopback cluster, one run
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from deploy import flwr_cli
from deploy.processes import Managed, ProcessSet, free_port, start

READY = "block forever"  # `ray start --block` logs this once the node runs
CONNECTION = "ray-cluster"
NO_AUTH_WARNING = ("WARNING: Ray has no authentication: whoever reaches this cluster's ports (GCS, raylet, "
                   "dashboard) can run code on every node and read its objects. --node-ip-address 127.0.0.1 "
                   "does not keep Ray 2.x on loopback (it listens on every interface): use it only on a "
                   "machine and network you trust, behind a firewall (docs/deployment.md).")
PORTS_PER_NODE = 16  # worker ports handed to each raylet (actors + prestarted workers)


def node_ports(head: bool) -> list[str]:
    """Explicit free ports for every Ray service of one node, so a second Ray cluster on the
    same machine (default ports 6379, 10001, 52365, ...) cannot collide with this one."""
    args = ["--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
            "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port()),
            "--worker-port-list", ",".join(str(free_port()) for _ in range(PORTS_PER_NODE))]
    if head:
        args += ["--ray-client-server-port", str(free_port())]
    return args


@dataclass
class LocalRayCluster:
    """``ray start --head`` plus ``num_workers`` worker nodes on this machine, all ``--block``.

    ``--block`` keeps every node's services children of a process we started, so the cluster
    is stopped by PID (never with ``ray stop``, which stops *every* Ray on the machine).
    """

    workdir: Path
    num_workers: int = 1
    cpus_per_node: int = 1
    gpus_per_node: int = 0
    object_store_bytes: int = 100 * 1024 * 1024
    startup_timeout: float = 180.0
    procs: ProcessSet = field(default_factory=ProcessSet)
    port: int = 0
    temp_dir: Path | None = None

    def __enter__(self) -> LocalRayCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _node(self, name: str, args: list[str]) -> Managed:
        env = flwr_cli.flower_env(self.workdir / "flwr-home", {"RAY_USAGE_STATS_ENABLED": "0"})
        env.pop("RAY_ADDRESS", None)
        cmd = [flwr_cli.executable("ray"), "start", *args, "--num-cpus", str(self.cpus_per_node),
               "--num-gpus", str(self.gpus_per_node), "--object-store-memory", str(self.object_store_bytes),
               "--disable-usage-stats", "--block"]
        m = self.procs.add(start(name, cmd, self.workdir / f"{name}.log", env=env))
        deadline = time.monotonic() + self.startup_timeout
        while READY not in m.log_text():
            if not m.alive():
                raise RuntimeError(f"{name} exited with {m.popen.returncode}\n{m.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready after {self.startup_timeout:.0f}s\n{m.tail()}")
            time.sleep(0.5)
        return m

    def start(self) -> None:
        """Head first (GCS on a free port), then the workers joining it."""
        self.workdir = Path(self.workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Ray puts Unix sockets under the temp dir: keep its path short (107-byte limit).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
        self.port = free_port()
        self._node("ray-head", ["--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port),
                                "--temp-dir", str(self.temp_dir), "--include-dashboard", "false",
                                *node_ports(head=True)])
        for i in range(self.num_workers):
            self._node(f"ray-worker-{i + 1}", ["--address", self.address, "--node-ip-address", "127.0.0.1",
                                               *node_ports(head=False)])

    def stop(self, remove_temp_dir: bool = True) -> None:
        """Stop every node's process tree by PID (SIGTERM, then SIGKILL after a grace period)."""
        self.procs.stop_all(grace=15.0)
        if remove_temp_dir and self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    # ------------------------------------------------------------------ evidence from the logs
    def logs_dir(self) -> Path:
        assert self.temp_dir is not None, "start() first"
        return self.temp_dir / "session_latest" / "logs"

    def node_ids(self) -> list[str]:
        """Ray node ids of the cluster's raylets (head first)."""
        ids = []
        for f in sorted(self.logs_dir().glob("raylet*.out")):
            m = re.search(r"node_id=([0-9a-f]{56})", f.read_text(errors="replace"))
            if m:
                ids.append(m.group(1))
        return ids

    def driver_pids(self) -> set[int]:
        """PIDs of the Ray drivers (``ray.init`` callers) that attached to this cluster."""
        return {int(f.stem.rsplit("_", 1)[1]) for f in self.logs_dir().glob("python-core-driver-*_*.log")}

    def job_worker_nodes(self) -> set[str]:
        """Node ids that ran workers for a driver job (job id != ffffffff), e.g. ClientApp actors."""
        nodes = set()
        for f in self.logs_dir().glob("worker-*-*-*.out"):
            job = f.name.split("-")[2]
            if job == "ffffffff":  # prestarted idle workers belong to no job
                continue
            core = self.logs_dir() / f"python-core-worker-{f.name.split('-')[1]}_{f.stem.rsplit('-', 1)[1]}.log"
            m = re.search(r"node_id=([0-9a-f]{56})", core.read_text(errors="replace")) if core.exists() else None
            if m:
                nodes.add(m.group(1))
        return nodes


def start_simulation_superlink(workdir: Path, ray_address: str, procs: ProcessSet, timeout: float = 120.0) -> int:
    """``flower-superlink --simulation`` whose runs attach to ``ray_address`` (via RAY_ADDRESS).

    Loopback only and without TLS, like the local SuperLink ``flwr run`` starts itself;
    writes the ``ray-cluster`` connection into ``workdir/cli/config.toml``. Returns the port.
    """
    port = free_port()
    home = workdir / "superlink-home"
    env = flwr_cli.flower_env(home / ".flwr", {"HOME": str(home), "RAY_ADDRESS": ray_address,
                                               "RAY_USAGE_STATS_ENABLED": "0"})
    home.mkdir(parents=True, exist_ok=True)
    link = procs.add(start("simulation-superlink", [
        flwr_cli.executable("flower-superlink"), "--insecure", "--simulation",
        "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(port),
    ], workdir / "simulation-superlink.log", env=env))
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).is_success:
                break
        except httpx.HTTPError:
            pass
        if not link.alive():
            raise RuntimeError(f"flower-superlink exited with {link.popen.returncode}\n{link.tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"simulation SuperLink not healthy after {timeout:.0f}s\n{link.tail()}")
        time.sleep(0.5)
    flwr_cli.write_connection(workdir / "cli", CONNECTION, f"127.0.0.1:{port}", insecure=True)
    return port


def cluster_backend_config(address: str, num_cpus: float = 1, num_gpus: float = 0.0) -> dict[str, Any]:
    """Backend config for ``run_simulation`` attaching to ``address`` (no num_cpus in init_args:
    Ray refuses resource arguments when it connects to an existing cluster)."""
    return {"client_resources": {"num_cpus": num_cpus, "num_gpus": num_gpus}, "init_args": {"address": address}}


def simulate_on_cluster(address: str, overrides: dict[str, Any], num_supernodes: int | None = None,
                        num_cpus: float = 1, num_gpus: float = 0.0) -> None:
    """Run one study config in-process (the adapter :mod:`flower_apps.engine`) on an existing cluster,
    on the SuperNodes the study says it needs (``StudySpec.nodes_needed``) unless ``num_supernodes`` is given."""
    from flower_apps.config import RUN_CONFIG_DEFAULTS
    from flower_apps.engine import simulate
    from flower_apps.router import make_server_app, prepare

    spec, cfg = prepare({**RUN_CONFIG_DEFAULTS, **overrides}, given=overrides)
    n = num_supernodes or spec.nodes_needed(cfg)
    simulate(make_server_app(overrides), n, backend=cluster_backend_config(address, num_cpus, num_gpus))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.ray_cluster", description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=1, help="worker nodes besides the head")
    p.add_argument("--cpus-per-node", type=int, default=1)
    p.add_argument("--workdir", help="default: a new temporary directory")
    p.add_argument("--run", help="run config overrides, e.g. \"preset='smoke'\"; run once through flwr run")
    p.add_argument("--num-supernodes", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ppfl-ray-"))
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # `with` below then stops the cluster
    with LocalRayCluster(workdir, args.workers, args.cpus_per_node) as cluster:
        print(f"Ray cluster at {cluster.address} ({args.workers + 1} nodes); logs in {workdir}")
        print(NO_AUTH_WARNING)
        if not args.run:
            print(f"  RAY_ADDRESS={cluster.address} flower-superlink --insecure --simulation ...   (Ctrl-C stops)")
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                return 0
        from strategies.flwr_adapter import parse_run_config as parse_config_args

        procs = ProcessSet()
        try:
            start_simulation_superlink(workdir, cluster.address, procs)
            run_id = flwr_cli.start_run(Path(__file__).resolve().parents[1], CONNECTION, workdir / "cli",
                                        parse_config_args([args.run]),
                                        {"num-supernodes": args.num_supernodes, "client-resources-num-cpus": 1})
            info = flwr_cli.wait_run(run_id, CONNECTION, workdir / "cli", args.timeout)
            print(flwr_cli.run_log(run_id, CONNECTION, workdir / "cli"))
            print(f"run {run_id}: {info['status']}")
            return 0 if info["status"] == "finished:completed" else 1
        finally:
            procs.stop_all()
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    raise SystemExit(main())
