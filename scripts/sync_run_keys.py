"""Rewrite pyproject.toml's [tool.flwr.app.config], docs/run_keys.md and each config class's typed view
(``<module>_fields.py`` beside the module that derives it) from the run-key declarations.

    python scripts/sync_run_keys.py          # rewrite both
    python scripts/sync_run_keys.py --check  # exit 1 (naming the file) if either is out of date

The declarations are flower_apps/config.py (common and shared keys) and each
flower_apps/<study>/study.py (the study's own); see flower_apps/keys.py for the renderings.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import flower_apps.example_minimal  # noqa: E402,F401  (derives its config class: its typed view is written too)
from flower_apps.config import CONFIG_CLASSES  # noqa: E402
from flower_apps.keys import fields_module, render_fields, render_markdown, render_pyproject_block  # noqa: E402

BLOCK_START = "[tool.flwr.app.config]"
BLOCK_END = "\n# SuperLink connections"  # the comment that follows the block in pyproject.toml


def synced_pyproject(text: str) -> str:
    """``text`` (pyproject.toml) with the run-key block replaced by the rendered one."""
    start = text.index(BLOCK_START)
    end = text.index(BLOCK_END, start) + 1
    return text[:start] + render_pyproject_block() + text[end:]


def fields_targets() -> dict[Path, str]:
    """``<module>_fields.py`` -> its text, for every config class this repository's flower_apps derives."""
    return {ROOT / (fields_module(entry).replace(".", "/") + ".py"): render_fields(entry)
            for entry in CONFIG_CLASSES if entry.cls.__module__.startswith("flower_apps.")}


def main() -> int:
    targets = {ROOT / "pyproject.toml": synced_pyproject((ROOT / "pyproject.toml").read_text()),
               ROOT / "docs" / "run_keys.md": render_markdown()}
    targets.update(fields_targets())
    stale = [path for path, new in targets.items() if not path.is_file() or path.read_text() != new]
    if "--check" in sys.argv:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is out of date: run python scripts/sync_run_keys.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(targets[path])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
