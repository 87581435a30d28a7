"""No random stream outside registry.streams, and no global torch seeding outside models.seeded_init.

Read with ``ast`` over every package and script of the repository (and the example studies under
tests/examples); nothing is imported. Refused outside the modules that own the concern:

* ``default_rng([...])`` / ``SeedSequence([...])`` with a key written inline (a tag no registry
  knows); only ``registry/streams.py`` builds keys, and ``privacy/randomness.py`` the secret noise's;
* seed arithmetic handed to a generator: ``.manual_seed(seed + 7)``, ``default_rng(seed * 1000 + v)``;
* torch's global generators seeded: ``torch.manual_seed``, ``torch.cuda.manual_seed(_all)``,
  ``torch.random.manual_seed``, ``default_generator.manual_seed``; only ``models/seeded_init.py``
  seeds them, inside a fork that it restores; and numpy's global ``np.random.seed``;
* a stream name, written as a literal, that is not registered.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from registry.streams import STREAMS

ROOT = Path(__file__).resolve().parents[2]
KEY_OWNERS = {"registry/streams.py", "privacy/randomness.py"}
GLOBAL_SEEDERS = {"models/seeded_init.py"}
STREAM_CALLS = {"rng", "spawn", "seed_int", "torch_generator", "stream"}


def sources(root: Path = ROOT) -> list[Path]:
    files = [p for pkg in sorted(root.iterdir()) if (pkg / "__init__.py").is_file() and pkg.name != "tests"
             for p in pkg.rglob("*.py")]
    return files + sorted((root / "scripts").glob("*.py")) + sorted((root / "tests" / "examples").glob("*.py"))


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def problems(tree: ast.AST, rel: str) -> list[str]:
    """What this module does that only the registry (or seeded_init) may do, one line each."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        first = node.args[0] if node.args else None
        where = f"{rel}:{node.lineno}"
        if last in {"default_rng", "SeedSequence"} and rel not in KEY_OWNERS:
            if isinstance(first, ast.List | ast.Tuple):
                found.append(f"{where}: {name}([...]): an inline stream key; name the stream in registry.streams")
            elif isinstance(first, ast.BinOp):
                found.append(f"{where}: {name}(<arithmetic>): seed arithmetic; register it in registry.streams")
        if last == "manual_seed" and isinstance(first, ast.BinOp) and rel not in KEY_OWNERS:
            found.append(f"{where}: .manual_seed(<arithmetic>): seed arithmetic; register it in registry.streams")
        if rel not in GLOBAL_SEEDERS and (name in {"torch.manual_seed", "torch.random.manual_seed",
                                                   "torch.cuda.manual_seed", "torch.cuda.manual_seed_all"}
                                          or name.endswith("default_generator.manual_seed")):
            found.append(f"{where}: {name}: seeds torch's global generator; use models.seeded_init.seeded_init")
        if name in {"np.random.seed", "numpy.random.seed"}:
            found.append(f"{where}: {name}: seeds numpy's global generator; take a registry.streams generator")
        if (last in STREAM_CALLS and name.startswith(("streams.", last)) and isinstance(first, ast.Constant)
                and isinstance(first.value, str) and first.value not in STREAMS):
            found.append(f"{where}: stream {first.value!r} is not registered in registry.streams")
    return found


def test_no_inline_stream_seed_arithmetic_or_global_seeding_in_the_tree():
    found = []
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        found += problems(ast.parse(path.read_text(), str(path)), rel)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("code, message", [
    ("np.random.default_rng([seed, 5])", "an inline stream key"),
    ("numpy.random.SeedSequence((seed, 17)).spawn(3)", "an inline stream key"),
    ("np.random.default_rng(seed * 1000 + victim)", "seed arithmetic"),
    ("torch.Generator().manual_seed(seed + 7)", "seed arithmetic"),
    ("torch.manual_seed(0)", "seeds torch's global generator"),
    ("torch.cuda.manual_seed_all(3)", "seeds torch's global generator"),
    ("torch.random.default_generator.manual_seed(3)", "seeds torch's global generator"),
    ("np.random.seed(1)", "seeds numpy's global generator"),
    ("streams.rng('datasets.partitoin', seed)", "'datasets.partitoin' is not registered"),
    ("rng('ultrasound.nope', seed, 1)", "'ultrasound.nope' is not registered"),
])
def test_the_scan_finds_each_planted_violation(code, message):
    (line,) = problems(ast.parse(code), "flower_apps/planted.py")
    assert message in line and line.startswith("flower_apps/planted.py:1")


def test_the_owners_and_fine_forms_pass():
    fine = ("streams.rng('datasets.partition', seed)\nnp.random.default_rng(seed)\n"
            "torch.Generator().manual_seed(seed)\nstreams.torch_generator('clients.sgd', seed, r, c)")
    assert problems(ast.parse(fine), "flower_apps/fine.py") == []
    assert problems(ast.parse("np.random.default_rng([seed, 3])"), "registry/streams.py") == []
    assert problems(ast.parse("torch.random.default_generator.manual_seed(s)"), "models/seeded_init.py") == []
    assert len(sources()) > 100 and ROOT / "registry" / "streams.py" in sources()
