"""The FAB that `flwr run` ships to the SuperLink and every SuperNode carries the code the apps import, and
nothing else: no kept results (they grow run by run; the FAB cap is 10 MB), docs, tests or benchmarks.

Built with Flower's own builder from the project's pyproject (``[tool.flwr.app] fab-include``).
"""

from __future__ import annotations

import ast
import io
import tomllib
import zipfile
from pathlib import Path

from flwr.cli.build import build_fab_from_disk

REPO = Path(__file__).resolve().parents[2]


def _fab_files() -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(REPO))) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _top_level_imports(source: bytes) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_fab_holds_every_project_package_its_code_imports_and_no_results_docs_or_tests():
    files = _fab_files()
    tops = {name.split("/")[0] for name in files}
    assert {"flower_apps", "privacy", "mixnet", "strategies", "datasets", "attacks"} <= tops, sorted(tops)
    leaked = sorted(t for t in tops if t.startswith("results") or t in {"docs", "tests", "benchmarks", "docker"})
    assert not leaked, f"the FAB carries {leaked}"
    # every import of a project top-level package (a folder of this repository) resolves inside the FAB
    project = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}
    needed: dict[str, str] = {}
    for name, data in files.items():
        if name.endswith(".py"):
            for top in _top_level_imports(data) & project:
                needed.setdefault(top, name)
    missing = {top: by for top, by in needed.items() if top not in tops}
    assert not missing, f"imported but not in the FAB (add them to fab-include): {missing}"
    assert "benchmarks" in project and "benchmarks" not in needed  # the check sees project folders



def test_fab_include_names_the_same_packages_as_the_wheel():
    """pyproject lists the code packages twice (hatch's wheel, Flower's fab-include): they must agree."""
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    wheel = cfg["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    fab = cfg["tool"]["flwr"]["app"]["fab-include"]
    assert all(p == f"{p.split('/')[0]}/**/*.py" for p in fab), fab
    assert sorted(p.split("/")[0] for p in fab) == sorted(wheel), (fab, wheel)


def test_no_packaged_module_is_named_like_a_test():
    """`flwr build` leaves test_*.py files out of the FAB: a study module of that name imports locally and then
    fails on every SuperNode and under `flwr run` (flower_apps/ultrasound/test_variance.py did)."""
    root = Path(__file__).resolve().parents[2]
    named = sorted(str(p.relative_to(root)) for pkg in ("flower_apps", "strategies", "privacy", "datasets", "attacks",
                                                         "models", "mixnet", "registry", "deploy")
                   for p in (root / pkg).rglob("test_*.py"))
    assert named == [], f"rename these (the FAB drops them): {named}"
