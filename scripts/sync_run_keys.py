"""Rewrite pyproject.toml's [tool.flwr.app.config] from the registered studies' run keys.

    python scripts/sync_run_keys.py          # rewrite
    python scripts/sync_run_keys.py --check  # exit 1 if pyproject is out of date

Keys are written grouped: the common keys, then each study's own keys under a comment.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flower_apps.config import COMMON_KEYS  # noqa: E402
from flower_apps.studies import BUILTIN, STUDIES  # noqa: E402


def render() -> str:
    out = ["[tool.flwr.app.config]", "# Common keys (every study). Defaults are the `paper` values; presets override them.",
           tomli_w.dumps(COMMON_KEYS).strip()]
    seen = set(COMMON_KEYS)
    for pkg in BUILTIN:
        try:
            mod = importlib.import_module(f"flower_apps.{pkg}.study")
        except ModuleNotFoundError:
            continue
        own = {k: v for k, v in mod.KEYS.items() if k not in seen}
        seen |= set(own)
        if own:
            out += ["", f"# {mod.SPEC.name}", tomli_w.dumps(own).strip()]
    return "\n".join(out) + "\n\n"


def main() -> int:
    assert STUDIES
    path = ROOT / "pyproject.toml"
    text = path.read_text()
    start = text.index("[tool.flwr.app.config]")
    end = text.index("\n# SuperLink connections") + 1
    new = text[:start] + render() + text[end:]
    if "--check" in sys.argv:
        return 0 if new == text else 1
    path.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
