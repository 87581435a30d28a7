"""Start and drive N node processes on loopback (the real-network mode).

:class:`LocalCluster` generates a CA and one certificate per node, spawns one
``mixnet.net_node`` process each, hands every node the bootstrap
directory (each node's signed record: id, Sphinx public key, endpoint,
Ed25519 identity key), and exposes the same calls as
the simulator: ``send``, ``inbox``, ``run_until_idle``, ``node_stats``.

Teardown is unconditional: :meth:`close` (also run by ``__exit__`` and by
``atexit``) asks each process to stop, then terminates and finally kills any
straggler, so no test leaves a process behind even when it fails.
"""

from __future__ import annotations

import atexit
import base64
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .config import MixnetConfig
from .delivery import DeliveredMessage
from .net_tls import generate_ca, issue_node_certificate, write_cert, write_key
from .stats import NodeStats


class _Process:
    """One node process with a thread that turns its stdout into a queue of JSON objects."""

    def __init__(self, node_id: int, spec_path: Path, log_path: Path) -> None:
        self.node_id = node_id
        self._log = log_path.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "mixnet.net_node", "--config", str(spec_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
        )
        self.lines: queue.Queue[dict] = queue.Queue()
        self._ids = 0
        self._stopped = False
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            try:
                self.lines.put(json.loads(raw))
            except json.JSONDecodeError:
                continue

    def wait_line(self, timeout: float) -> dict:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"node {self.node_id} did not answer within {timeout} s") from None

    def request(self, timeout: float = 10.0, **command: Any) -> Any:
        self._ids += 1
        command["id"] = self._ids
        assert self.popen.stdin is not None
        self.popen.stdin.write((json.dumps(command) + "\n").encode())
        self.popen.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            reply = self.wait_line(max(0.01, deadline - time.monotonic()))
            if reply.get("id") == self._ids:
                if "error" in reply:
                    raise RuntimeError(f"node {self.node_id}: {reply['error']}")
                return reply["result"]

    def stop(self, grace: float = 2.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.popen.poll() is None:
            try:
                self.request(timeout=grace, cmd="stop")
            except (OSError, TimeoutError, RuntimeError, ValueError):
                pass
        for action in (lambda: None, self.popen.terminate, self.popen.kill):
            if self.popen.poll() is not None:
                break
            action()
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self._log.close()


class LocalCluster:
    """``n_nodes`` node processes on 127.0.0.1, linked by mutual TLS.

    Parameters
    ----------
    config
        Transport parameters (sent to every node).
    n_nodes
        Number of processes.
    workdir
        Where certificates, specs and per-node logs go (default: a temp dir).
    seed
        Seeds each node's route/delay generator (keys always come from ``os.urandom``).
    """

    def __init__(self, config: MixnetConfig, n_nodes: int, workdir: Path | None = None,
                 seed: int | None = None, startup_timeout: float = 30.0) -> None:
        if not isinstance(n_nodes, int) or n_nodes < 2:
            raise ValueError(f"n_nodes must be an int >= 2, got {n_nodes!r}")
        self.config = config
        self.n_nodes = n_nodes
        self.seed = seed
        self.startup_timeout = startup_timeout
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="mixnet-")
            self.workdir = Path(self._tmp.name)
        else:
            self.workdir = Path(workdir)
        self.processes: dict[int, _Process] = {}
        self.directory: list[dict] = []
        atexit.register(self.close)

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ca_key, ca_cert = generate_ca()
        ca_path = self.workdir / "ca.pem"
        write_cert(ca_path, ca_cert)
        mixnet = {k: v for k, v in self.config.__dict__.items()}
        for i in range(self.n_nodes):
            key, cert = issue_node_certificate(ca_key, ca_cert, i)
            write_key(self.workdir / f"node{i}.key", key)
            write_cert(self.workdir / f"node{i}.pem", cert)
            spec = {"node_id": i, "cert": str(self.workdir / f"node{i}.pem"), "key": str(self.workdir / f"node{i}.key"),
                    "ca": str(ca_path), "mixnet": mixnet,
                    "seed": None if self.seed is None else f"{self.seed}/node/{i}"}
            spec_path = self.workdir / f"node{i}.json"
            spec_path.write_text(json.dumps(spec))
            self.processes[i] = _Process(i, spec_path, self.workdir / f"node{i}.log")
        for i, proc in self.processes.items():
            ready = proc.wait_line(self.startup_timeout)
            if ready.get("event") != "ready":
                raise RuntimeError(f"node {i} did not start: {ready}")
            self.directory.append(ready["record"])  # signed by the node; the directory pins its identity
        for proc in self.processes.values():
            proc.request(cmd="peers", peers=self.directory)

    def send(self, src: int, dst: int, data: bytes) -> bytes:
        return bytes.fromhex(self.processes[src].request(cmd="send", dst=dst, data=base64.b64encode(data).decode()))

    def inbox(self, node_id: int) -> list[DeliveredMessage]:
        return [DeliveredMessage(bytes.fromhex(m["message_id"]), base64.b64decode(m["data"]), m["time"])
                for m in self.processes[node_id].request(cmd="inbox")]

    def status(self, node_id: int) -> dict:
        return self.processes[node_id].request(cmd="status")

    def node_stats(self) -> dict[int, NodeStats]:
        return {i: NodeStats.from_dict(self.status(i)["stats"]) for i in self.processes if self.is_running(i)}

    def is_running(self, node_id: int) -> bool:
        return self.processes[node_id].popen.poll() is None

    def kill(self, node_id: int) -> None:
        """Crash a node (SIGKILL): its peers must notice on their own."""
        self.processes[node_id].popen.kill()
        self.processes[node_id].popen.wait(timeout=5)

    def run_until_idle(self, timeout: float = 30.0, poll: float = 0.1) -> float:
        """Wait until no running node has an unacknowledged fragment; returns seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if all(self.status(i)["pending"] == 0 for i in self.processes if self.is_running(i)):
                return time.monotonic() - start
            time.sleep(poll)
        raise TimeoutError(f"cluster not idle after {timeout} s")

    def close(self) -> None:
        for proc in self.processes.values():
            proc.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        atexit.unregister(self.close)
