"""Fixtures shared by the docs-check tests (test_doc_blocks.py, test_audit_docs.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def copy(tmp_path: Path) -> Path:
    """README.md and docs/ copied; the kept results folders linked (read only)."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for kept in ROOT.glob("results_*"):
        (tmp_path / kept.name).symlink_to(kept)
    return tmp_path
