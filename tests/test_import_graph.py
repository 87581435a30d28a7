"""The project's import graph has no cycle, and the shared packages never import flower_apps.

Built with ``ast`` (nothing is imported): an edge A -> B for every ``import`` in A that names
project module B, at module level or inside a function (a lazy import hides a cycle, it does not
remove it). ``from pkg import name`` points at ``pkg.name`` when that is a module, else at ``pkg``.
A module's imports of its own parent packages are not edges: Python initialises those first.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flower_apps", "strategies", "privacy", "datasets", "attacks")
SHARED = ("strategies", "privacy", "datasets", "attacks")


def project_modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def imports_of(module: str, path: Path, mods: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in mods:  # `import a.b.c` of a non-module attribute: its module
                target = target.rpartition(".")[0]
            if target and target != module and not module.startswith(target + "."):
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    mods = project_modules()
    return {m: imports_of(m, p, mods) for m, p in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for start in sorted(edges):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(edges[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(edges[nxt])))
    return None


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_relative_and_from_imports_resolve_to_modules():
    edges = graph()
    assert "flower_apps.config" in edges["flower_apps.studies"]
    assert "privacy.mixnet.node" in edges["privacy.mixnet"]  # `from .node import MixNode`
    assert "privacy.mixnet" not in edges["privacy.mixnet.node"]  # its own package: not an edge


def test_import_graph_is_acyclic():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("pkg", SHARED)
def test_shared_packages_never_import_flower_apps(pkg):
    bad = {m: sorted(t for t in ts if t.split(".")[0] == "flower_apps")
           for m, ts in graph().items() if m.split(".")[0] == pkg}
    assert not {m: ts for m, ts in bad.items() if ts}


def test_a_study_module_imports_nothing_of_its_package_that_reads_its_keys():
    edges = graph()
    for study in (m for m in edges if m.endswith(".study") and m.startswith("flower_apps.")):
        pkg = study.rpartition(".")[0]
        assert not {f"{pkg}.config", f"{pkg}.server_app", f"{pkg}.client_app"} & edges[study], study
