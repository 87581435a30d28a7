"""One mixnet node as an OS process: the same :class:`MixNode`, over mutual-TLS TCP links.

Run as ``python -m mixnet.net_node --config node.json``. The process
listens on ``127.0.0.1`` (port chosen by the OS), prints one JSON ``ready`` line
with its port and its signed peer record (Sphinx public key, Ed25519 identity
key, version, signature; :func:`record_json`), then serves JSON-line commands on stdin
(``peers``, ``join``, ``send``, ``inbox``, ``status``, ``stop``), one JSON reply
line each on stdout. It exits on ``stop`` or when stdin closes, so it never
outlives its controller.

Links: one outgoing TLS connection per peer, opened on first use; frames are
length-prefixed (4 bytes, big endian). A refused or broken connection is the
connectivity signal handed to :meth:`MixNode.on_link_failure`. The sender id
handed to :meth:`MixNode.on_frame` is the verified peer certificate's, so a
JOIN about node X counts as X's own only over a link whose certificate names X.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import ssl
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from .config import MixnetConfig
from .crypto import SystemRandomSource
from .delivery import DeliveredMessage
from .net_tls import client_context, node_name, peer_node_id, server_context
from .node import MixNode, TxMeta
from .peers import PeerInfo

_LEN = struct.Struct(">I")
MAX_FRAME = 1 << 20


class AsyncioEnv:
    """:class:`~mixnet.node.NodeEnvironment` over an asyncio loop and TLS links."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client_ctx: ssl.SSLContext) -> None:
        self.loop = loop
        self.client_ctx = client_ctx
        self.node: MixNode | None = None
        self.acked: list[str] = []
        self.failed: list[str] = []
        self._queues: dict[int, asyncio.Queue[bytes]] = {}

    def now(self) -> float:
        return self.loop.time()

    def run_timed(self, fn: Callable[[], Any]) -> Any:
        """Run node code, charging its process time to the node's stats."""
        assert self.node is not None
        start = time.process_time()
        try:
            return fn()
        finally:
            self.node.stats.cpu_time_s += time.process_time() - start

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self.loop.call_later(max(0.0, delay), self.run_timed, callback)

    def transmit(self, src: int, dst: int, frame: bytes, meta: TxMeta) -> None:
        queue = self._queues.get(dst)
        if queue is None:
            queue = self._queues[dst] = asyncio.Queue()
            self.loop.create_task(self._writer(dst, queue))
        queue.put_nowait(frame)

    async def _writer(self, dst: int, queue: asyncio.Queue[bytes]) -> None:
        assert self.node is not None
        info = self.node.view.get(dst)
        writer = None
        try:
            if info is None or not info.endpoint:
                raise ConnectionError(f"no endpoint for node {dst}")
            host, port = info.endpoint.rsplit(":", 1)
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), ssl=self.client_ctx, server_hostname=node_name(dst)), 5.0
            )
            while True:
                frame = await queue.get()
                writer.write(_LEN.pack(len(frame)) + frame)
                await writer.drain()
        except (TimeoutError, OSError, ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            self._queues.pop(dst, None)
            self.run_timed(lambda: self.node.on_link_failure(dst))  # type: ignore[union-attr]
        finally:
            if writer is not None:
                writer.close()

    def on_delivered(self, node_id: int, message: DeliveredMessage) -> None:
        pass  # the node's inbox is polled through the ``inbox`` command

    def on_acked(self, node_id: int, message_id: bytes) -> None:
        self.acked.append(message_id.hex())

    def on_failed(self, node_id: int, message_id: bytes) -> None:
        self.failed.append(message_id.hex())


async def _serve_link(env: AsyncioEnv, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        peer = peer_node_id(writer.get_extra_info("peercert"))
        while True:
            (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
            if n > MAX_FRAME:
                break
            frame = await reader.readexactly(n)
            env.run_timed(lambda: env.node.on_frame(peer, frame))  # type: ignore[union-attr]  # noqa: B023 - called now
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, ValueError, OSError):
        pass
    finally:
        writer.close()


def record_json(info: PeerInfo) -> dict:
    """A signed peer record as JSON (the ``ready`` line and the controller's directory)."""
    return {"node_id": info.node_id, "public_key": info.public_key.hex(), "endpoint": info.endpoint,
            "identity": info.identity.hex(), "version": info.version, "signature": info.signature.hex()}


def _peer(record: dict) -> PeerInfo:
    return PeerInfo(int(record["node_id"]), bytes.fromhex(record["public_key"]), record["endpoint"],
                    bytes.fromhex(record["identity"]), int(record["version"]), bytes.fromhex(record["signature"]))


def _handle(env: AsyncioEnv, node: MixNode, command: dict) -> Any:
    cmd = command.get("cmd")
    if cmd == "peers":
        for info in [_peer(r) for r in command["peers"]]:  # parse all first: a malformed list changes nothing
            node.add_peer(info)
        return len(node.view.routable())
    if cmd == "join":
        env.run_timed(lambda: node.join([_peer(r) for r in command["bootstrap"]]))
        return True
    if cmd == "send":
        data = base64.b64decode(command["data"])
        return env.run_timed(lambda: node.send(int(command["dst"]), data)).hex()
    if cmd == "inbox":
        return [{"message_id": m.message_id.hex(), "data": base64.b64encode(m.data).decode(), "time": m.time}
                for m in node.inbox]
    if cmd == "status":
        return {"pending": node.pending_fragments, "outbox": len(node.outbox), "acked": env.acked,
                "failed": env.failed, "routable": node.view.routable(), "stats": node.stats.as_dict(),
                "peers": [record_json(info) for info in node.view.known()],
                "partial_messages": node.partial_messages}
    raise ValueError(f"unknown command {cmd!r}")


async def run_node(config_path: Path) -> None:
    spec = json.loads(config_path.read_text())
    loop = asyncio.get_running_loop()
    cert, key, ca = Path(spec["cert"]), Path(spec["key"]), Path(spec["ca"])
    env = AsyncioEnv(loop, client_context(cert, key, ca))
    server = await asyncio.start_server(lambda r, w: _serve_link(env, r, w), "127.0.0.1", 0,
                                        ssl=server_context(cert, key, ca))
    port = server.sockets[0].getsockname()[1]
    config = MixnetConfig.from_mapping(spec["mixnet"])
    seed = spec.get("seed")
    # epoch: start time in ms, so a restarted process's records supersede its earlier ones
    node = MixNode(int(spec["node_id"]), X25519PrivateKey.generate(), config, env,
                   rng=random.Random(seed) if seed is not None else random.SystemRandom(),
                   crypto_rng=SystemRandomSource(), identity_key=Ed25519PrivateKey.generate(),
                   endpoint=f"127.0.0.1:{port}", epoch=time.time_ns() // 1_000_000)
    env.node = node
    print(json.dumps({"event": "ready", "node_id": node.node_id, "port": port, "record": record_json(node.info),
                      "public_key": node.info.public_key.hex()}), flush=True)
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    try:
        while line := await stdin.readline():
            command = json.loads(line)
            if command.get("cmd") == "stop":
                print(json.dumps({"id": command.get("id"), "result": True}), flush=True)
                break
            try:
                reply = {"id": command.get("id"), "result": _handle(env, node, command)}
            except Exception as exc:  # report to the controller, keep serving
                reply = {"id": command.get("id"), "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(reply), flush=True)
    finally:
        node.alive = False
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="node spec written by LocalCluster")
    args = parser.parse_args(argv)
    asyncio.run(run_node(args.config))


if __name__ == "__main__":
    main()
