"""The project's import graph has no cycle, between modules or between packages, and arrows point one way.

Built with ``ast`` (nothing is imported) over every top-level package of the repository (a folder
with an ``__init__.py``: flower_apps, strategies, privacy, mixnet, models, datasets, attacks,
registry, deploy, benchmarks) and the scripts in ``scripts/``. An edge A -> B for

* every ``import`` in A that names project module B, at module level or inside a function (a lazy
  import hides a cycle, it does not remove it). ``from pkg import name`` points at ``pkg.name``
  when that is a module, else at ``pkg``;
* every ``importlib.import_module("b.c")`` / ``import_module(".c", __package__)`` /
  ``__import__("b.c")`` with a literal name; an f-string name (``f"flower_apps.{pkg}.study"``)
  points at the package its literal prefix names, the most that can be known without running it.

A module's imports of its own parent packages are not edges: Python initialises those first.
The package graph (each module's edges, seen from its top-level package) must be acyclic too:
``flower_apps.launch -> deploy.flwr_cli`` beside ``deploy.export -> flower_apps.*`` was no module
cycle, but a package loop (issue 38).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: shared packages: what studies compose. They never import the apps, the deployment tooling,
#: the benchmarks or the scripts.
SHARED = ("strategies", "privacy", "mixnet", "models", "datasets", "attacks", "registry")
#: everything the graph must cover (a new top-level package joins by having an __init__.py)
EXPECTED = {"flower_apps", "deploy", "benchmarks", "scripts", *SHARED}
#: what each package may import, beyond itself; the order of the layers, bottom up.
#: mixnet sits beside privacy (it may use privacy's pure math; privacy never imports it).
ALLOWED = {
    "registry": set(),
    "privacy": {"registry"},
    "datasets": {"registry"},
    "models": {"registry"},
    "mixnet": {"registry", "privacy"},
    "strategies": {"registry", "privacy", "datasets", "models"},
    "attacks": {"registry", "privacy", "mixnet", "datasets", "models"},
    "flower_apps": {*SHARED},
    "deploy": {*SHARED, "flower_apps"},
    "benchmarks": {*SHARED, "flower_apps", "deploy"},
    "scripts": {*SHARED, "flower_apps", "deploy", "benchmarks"},
}
#: deploy modules the docker images run with nothing but deploy/ copied (docker/app.Dockerfile)
DEPLOY_STANDALONE = ("deploy.flwr_cli", "deploy.certs", "deploy.processes")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of every top-level package under ``root``, and the scripts in ``root/scripts``."""
    mods = {}
    for pkg in sorted(p for p in root.iterdir() if (p / "__init__.py").is_file()):
        for path in pkg.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((root / "scripts").glob("*.py")):
        mods[f"scripts.{path.stem}"] = path
    return mods


def _resolve(name: str, level: int, package: str) -> str:
    """The absolute name of ``from <level dots><name>`` inside ``package``."""
    if not level:
        return name
    anchor = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(anchor + ([name] if name else []))


def _dynamic_target(call: ast.Call, package: str) -> str | None:
    """The module an ``importlib.import_module(...)`` / ``import_module(...)`` / ``__import__(...)`` call
    names, when its first argument is a literal (or an f-string with a literal prefix); else None."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in {"import_module", "__import__"} or not call.args:
        return None
    if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id == "importlib"):
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        text = arg.value
    elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        text = str(arg.values[0].value).rpartition(".")[0]  # "flower_apps." + {pkg}: the package
    else:
        return None
    if text.startswith("."):  # import_module(".x", __package__): relative to this module's package
        if name != "import_module" or len(call.args) < 2:
            return None
        dots = len(text) - len(text.lstrip("."))
        return _resolve(text[dots:], dots, package)
    return text or None


def imports_of(module: str, path: Path, mods: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, package)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        elif isinstance(node, ast.Call) and (target := _dynamic_target(node, package)):
            targets = [target]
        else:
            continue
        for target in targets:
            while target and target not in mods:  # `import a.b.c` of a non-module attribute: its module
                target = target.rpartition(".")[0]
            if target and target != module and not module.startswith(target + "."):
                out.add(target)
    return out


@cache  # parsed once per root for the whole module; callers do not mutate it
def graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = project_modules(root)
    return {m: imports_of(m, p, mods) for m, p in mods.items()}


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Top-level package -> the other top-level packages its modules import."""
    out: dict[str, set[str]] = {}
    for m, targets in edges.items():
        top = m.split(".")[0]
        out.setdefault(top, set()).update(t.split(".")[0] for t in targets if t.split(".")[0] != top)
    return out


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
                stack.append(iter(sorted(edges.get(nxt, ()))))
    return None


def _plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("call,cycle", [
    ('importlib.import_module("pkg.b")', ["pkg.a", "pkg.b", "pkg.a"]),
    ('__import__("pkg.b")', ["pkg.a", "pkg.b", "pkg.a"]),
    ('import_module(".b", __package__)', ["pkg.a", "pkg.b", "pkg.a"]),
    ('importlib.import_module(f"other.{name}")', ["other", "pkg.a", "other"]),  # the literal prefix's package
    ('importlib.import_module(name)', None),  # a name known only at run time: no edge, the test's blind spot
])
def test_a_planted_cycle_through_a_dynamic_import_is_found(tmp_path, call, cycle):
    """pkg.a reaches pkg.b (or other) only through importlib, inside a function; both import pkg.a back."""
    root = _plant(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": f"import importlib\nfrom importlib import import_module\n\n\ndef load(name='b'):\n    return {call}\n",
        "pkg/b.py": "from pkg import a\n",
        "other/__init__.py": "import pkg.a\n",
        "scripts/tool.py": "import pkg.a\n",
    })
    edges = graph(root)
    assert edges["scripts.tool"] == {"pkg.a"}
    assert find_cycle(edges) == cycle


def test_a_planted_package_loop_without_a_module_cycle_is_found(tmp_path):
    """The shape of issue 38's flower_apps.launch -> deploy -> flower_apps: no module cycle, a package loop."""
    root = _plant(tmp_path, {
        "apps/__init__.py": "", "apps/launch.py": "from tools.cli import executable\n", "apps/router.py": "",
        "tools/__init__.py": "", "tools/cli.py": "",
        "tools/export.py": "def main():\n    import importlib\n    importlib.import_module('apps.router')\n",
    })
    edges = graph(root)
    assert find_cycle(edges) is None
    assert find_cycle(package_graph(edges)) in (["apps", "tools", "apps"], ["tools", "apps", "tools"])


def test_the_graph_covers_every_package_and_resolves_relative_and_dynamic_imports():
    edges = graph()
    assert EXPECTED <= {m.split(".")[0] for m in edges}, sorted({m.split(".")[0] for m in edges})
    assert set(package_graph(edges)) <= set(ALLOWED), "a new top-level package: give it a row in ALLOWED"
    assert "flower_apps.config" in edges["flower_apps.studies"]
    assert "mixnet.node" in edges["mixnet"]  # `from .node import MixNode`
    assert "mixnet" not in edges["mixnet.node"]  # its own package: not an edge
    assert "flower_apps.router" in edges["benchmarks.gpu_check"]  # importlib.import_module("flower_apps.router")
    assert "flower_apps.keys" in edges["scripts.sync_run_keys"]


def test_import_graph_is_acyclic():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_package_graph_is_acyclic():
    cycle = find_cycle(package_graph(graph()))
    assert cycle is None, "package loop: " + " -> ".join(cycle)


@pytest.mark.parametrize("pkg", sorted(ALLOWED))
def test_packages_import_only_the_layers_below_them(pkg):
    """Shared packages never import flower_apps or deploy; privacy never imports mixnet; the apps never
    import deploy (deploy runs and exports them)."""
    bad = {m: sorted(t for t in ts if t.split(".")[0] not in ALLOWED[pkg] | {pkg})
           for m, ts in graph().items() if m.split(".")[0] == pkg}
    assert not {m: ts for m, ts in bad.items() if ts}


def test_the_allowed_layers_themselves_have_no_loop():
    assert find_cycle(ALLOWED) is None
    for pkg in SHARED:
        assert not {"flower_apps", "deploy", "benchmarks", "scripts"} & ALLOWED[pkg], pkg
    assert "mixnet" not in ALLOWED["privacy"]


@pytest.mark.parametrize("module", DEPLOY_STANDALONE)
def test_deploy_modules_the_docker_images_run_import_no_other_package(module):
    edges = graph()
    assert {t for t in edges[module] if not t.startswith("deploy")} == set()


def test_a_study_module_imports_nothing_of_its_package_that_reads_its_keys():
    edges = graph()
    for study in (m for m in edges if m.endswith(".study") and m.startswith("flower_apps.")):
        pkg = study.rpartition(".")[0]
        assert not {f"{pkg}.config", f"{pkg}.server_app", f"{pkg}.client_app"} & edges[study], study
