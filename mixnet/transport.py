"""Pick the transport from configuration: virtual-time simulation or real processes.

Both expose ``send(src, dst, data) -> message id``, ``inbox(node)``,
``run_until_idle(...)``, ``node_stats()`` and ``close()``, so the learning layer
is written once against :class:`Transport`.
"""

from __future__ import annotations

from typing import Any, Protocol

from .config import MixnetConfig
from .delivery import DeliveredMessage
from .stats import NodeStats


class Transport(Protocol):
    def send(self, src: int, dst: int, data: bytes) -> bytes: ...

    def inbox(self, node_id: int) -> list[DeliveredMessage]: ...

    def run_until_idle(self, *args: Any, **kwargs: Any) -> float: ...

    def node_stats(self) -> dict[int, NodeStats]: ...

    def close(self) -> None: ...


def create_transport(config: MixnetConfig, n_nodes: int, seed: int = 0, **options: Any) -> Transport:
    """A started transport of ``n_nodes`` peers, chosen by ``config.transport``.

    ``options`` go to :class:`~mixnet.simulator.Simulator` (topology,
    latency, loss, ...) or :class:`~mixnet.net_cluster.LocalCluster`
    (workdir, startup_timeout). Call ``close()`` when done (a cluster owns processes).
    """
    if config.transport == "simulation":
        from .simulator import Simulator

        return Simulator(config, n_nodes, seed=seed, **options)
    if config.transport == "network":
        from .net_cluster import LocalCluster

        cluster = LocalCluster(config, n_nodes, seed=seed, **options)
        try:
            cluster.start()
        except BaseException:
            cluster.close()
            raise
        return cluster
    raise ValueError(f"config.transport must be 'simulation' or 'network', got {config.transport!r}")
