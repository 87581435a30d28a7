"""The linter (ruff) and the type checker (mypy) find nothing, so the README's test command fails on either.

Both run as ``python -m ruff`` / ``python -m mypy`` with the project's configuration
(``[tool.ruff]``, ``[tool.mypy]`` in pyproject.toml; versions pinned in the ``dev`` extra). Each
detector is tested by planting what it must find (an unused import, a wrong return type) and
checking that the same call fails and names it (issue 38).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "pyproject.toml"


def _run(args: list[str]) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def ruff(*paths: str) -> tuple[int, str]:
    """``ruff check`` with the project's config over ``paths`` (default: the repository)."""
    return _run(["ruff", "check", "--config", str(CONFIG), "--output-format", "concise", *(paths or ["."])])


def mypy(*paths: str) -> tuple[int, str]:
    """``mypy`` with the project's config over ``paths`` (default: its ``files``, the shared packages)."""
    return _run(["mypy", "--config-file", str(CONFIG), *paths])


def test_ruff_finds_nothing():
    rc, out = ruff()
    assert rc == 0, f"ruff check found problems (fix them, or see [tool.ruff] in pyproject.toml):\n{out}"


def test_mypy_finds_nothing():
    rc, out = mypy()
    assert rc == 0, f"mypy found problems in the checked packages (pyproject.toml [tool.mypy] files):\n{out}"
    assert "Success: no issues found" in out, out


def test_ruff_fires_on_a_planted_unused_import_and_import_order(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import sys\nimport os\n\n\ndef f() -> int:\n    return 1\n")
    rc, out = ruff(str(planted))
    assert rc == 1, out
    assert "F401" in out and "`sys` imported but unused" in out, out
    assert "I001" in out, out  # isort: os before sys


def test_mypy_fires_on_a_planted_type_error(tmp_path):
    planted = tmp_path / "planted_types.py"
    planted.write_text("def f(x: int) -> str:\n    return x\n")
    rc, out = mypy(str(planted))
    assert rc == 1, out
    assert "planted_types.py:2: error: Incompatible return value type" in out, out
