"""Overlay topologies: who learns with whom, and whom a node bootstraps from.

Three families from the UnlinkableDFL evaluation: circulant graphs ``C_n(1..d/2)``
(the paper's degree-4 ring-of-rings), full mesh, and random ``d``-regular graphs
(``networkx.random_regular_graph``). A registry maps names to builders and refuses
duplicates, so tests parametrized over it cover every family.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from registry import Registry


@dataclass(frozen=True)
class Topology:
    """An undirected simple graph on nodes ``0..n-1``."""

    name: str
    adjacency: tuple[tuple[int, ...], ...]

    @property
    def n(self) -> int:
        return len(self.adjacency)

    def neighbours(self, node: int) -> tuple[int, ...]:
        if not 0 <= node < self.n:
            raise ValueError(f"node must be in [0, {self.n}), got {node}")
        return self.adjacency[node]

    def degrees(self) -> list[int]:
        return [len(a) for a in self.adjacency]

    def edges(self) -> list[tuple[int, int]]:
        return [(i, j) for i, nbrs in enumerate(self.adjacency) for j in nbrs if i < j]


def _from_sets(name: str, sets: list[set[int]]) -> Topology:
    return Topology(name, tuple(tuple(sorted(s)) for s in sets))


def circulant(n: int, degree: int = 4, rng: random.Random | None = None) -> Topology:
    """Circulant graph: node ``i`` links to ``i +- 1, ..., i +- degree/2 (mod n)``."""
    if not isinstance(degree, int) or degree < 2 or degree % 2:
        raise ValueError(f"degree must be an even int >= 2, got {degree!r}")
    if not isinstance(n, int) or n <= degree:
        raise ValueError(f"n must be an int > degree ({degree}), got {n!r}")
    sets = [{(i + o) % n for o in range(1, degree // 2 + 1)} | {(i - o) % n for o in range(1, degree // 2 + 1)}
            for i in range(n)]
    return _from_sets("circulant", sets)


def full_mesh(n: int, degree: int | None = None, rng: random.Random | None = None) -> Topology:
    """Every node linked to every other (``degree`` is ignored, it is ``n - 1``)."""
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int >= 2, got {n!r}")
    return _from_sets("full-mesh", [set(range(n)) - {i} for i in range(n)])


def random_regular(n: int, degree: int = 4, rng: random.Random | None = None) -> Topology:
    """Uniform random ``degree``-regular graph (seeded ``random.Random`` required)."""
    if rng is None:
        raise ValueError("rng must be a seeded random.Random for random-regular topologies")
    if not isinstance(degree, int) or not 1 <= degree < n or (n * degree) % 2:
        raise ValueError(f"degree must be an int in [1, n) with n * degree even, got {degree!r} for n={n!r}")
    graph = nx.random_regular_graph(degree, n, seed=rng)
    return _from_sets("random-regular", [set(graph.neighbors(i)) for i in range(n)])


TopologyBuilder = Callable[..., Topology]
TOPOLOGIES: Registry[TopologyBuilder] = Registry("topology")
register_topology = TOPOLOGIES.register


register_topology("circulant", circulant)
register_topology("full-mesh", full_mesh)
register_topology("random-regular", random_regular)


def make_topology(name: str, n: int, degree: int = 4, rng: random.Random | None = None) -> Topology:
    """Build a registered topology by name."""
    if name not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {sorted(TOPOLOGIES)}, got {name!r}")
    return TOPOLOGIES[name](n, degree, rng)
