"""Add the resolved config of every registered preset that the golden files lack.

    python scripts/golden_presets.py          # add the missing presets (never rewrites a kept one)
    python scripts/golden_presets.py --check  # exit 1 naming the presets the golden files lack

tests/flower_apps/test_resolved_presets.py checks that every preset of every built-in study resolves
to its golden config. ``golden/resolved_presets.json`` is the snapshot taken before the one-key-table
refactor (read through the test's FIELD_CHANGES); presets registered after it are kept, exactly as they
resolved when added, in ``golden/added_presets.json``, which this script writes. A kept entry is never
rewritten: a preset whose resolution changes fails the test, and the change is either a regression or
goes into the test's PRESET_CHANGES with the issue that made it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flower_apps.router import prepare  # noqa: E402
from flower_apps.studies import BUILTIN_STUDIES, STUDIES  # noqa: E402

GOLDEN_DIR = ROOT / "tests" / "flower_apps" / "golden"
SNAPSHOT = GOLDEN_DIR / "resolved_presets.json"
ADDED = GOLDEN_DIR / "added_presets.json"


def builtin_presets() -> list[str]:
    """``study/preset`` of every preset of the built-in studies (the ones this repository ships)."""
    return sorted(f"{s}/{p}" for s in BUILTIN_STUDIES for p in STUDIES[s].presets)


def resolved(name: str) -> dict:
    study, preset = name.split("/")
    return json.loads(json.dumps(asdict(prepare({"study": study, "preset": preset})[1])))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    kept = set(json.loads(SNAPSHOT.read_text()))
    added = json.loads(ADDED.read_text()) if ADDED.is_file() else {}
    missing = [n for n in builtin_presets() if n not in kept and n not in added]
    if "--check" in argv:
        for name in missing:
            print(f"preset {name} has no golden config: run python scripts/golden_presets.py", file=sys.stderr)
        return 1 if missing else 0
    for name in missing:
        added[name] = resolved(name)
        print(f"added {name}")
    if missing:
        tmp = ADDED.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(sorted(added.items())), indent=1, sort_keys=True) + "\n")
        tmp.replace(ADDED)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
