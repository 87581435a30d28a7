"""The type checker's view of each derived config class (``<module>_fields.py``) matches its key table.

The classes are built at run time by ``KeyTable.config_class``; mypy reads the generated ``*_fields.py``
instead. These tests fail when the two drift apart: a stale file, a field of the wrong type, a class with no
typed view.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import types
import typing
from pathlib import Path

import pytest

import flower_apps.example_minimal  # noqa: F401  (derives its config class)
from flower_apps.config import CONFIG_CLASSES, ConfigClass, resolve
from flower_apps.keys import fields_module, render_fields
from flower_apps.studies import STUDIES

ROOT = Path(__file__).resolve().parents[2]
OURS = [e for e in CONFIG_CLASSES if e.cls.__module__.startswith("flower_apps.")]


def test_every_config_class_in_flower_apps_has_an_up_to_date_typed_view():
    calls = {str(p.relative_to(ROOT)) for p in (ROOT / "flower_apps").rglob("*.py")
             if re.search(r"\.config_class\(\"", p.read_text())}
    derived = {e.cls.__module__.replace(".", "/") + ".py" for e in OURS}
    assert calls == derived, "a config_class call whose class is not imported by the registry or example"
    for entry in OURS:
        path = ROOT / (fields_module(entry).replace(".", "/") + ".py")
        assert path.is_file(), f"{path} is missing: run python scripts/sync_run_keys.py"
        assert path.read_text() == render_fields(entry), f"{path} is stale: run python scripts/sync_run_keys.py"


def _check(value, annotation, where):
    origin = typing.get_origin(annotation)
    if annotation is float:
        assert isinstance(value, float), where
    elif annotation in (int, str, bool):
        assert type(value) is annotation, where  # bool is not an int here, and an int not a bool
    elif origin in (types.UnionType, typing.Union):
        assert any(_fits(value, a) for a in typing.get_args(annotation)), where
    elif origin is tuple:
        item = typing.get_args(annotation)[0]
        assert isinstance(value, tuple), where
        for v in value:
            _check(v, item, where)
    elif annotation is type(None):
        assert value is None, where
    else:
        raise AssertionError(f"{where}: annotation {annotation!r} is not one this test knows")


def _fits(value, annotation) -> bool:
    try:
        _check(value, annotation, "")
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("entry", OURS, ids=lambda e: e.cls.__name__)
def test_typed_view_has_the_fields_types_and_defaults_of_the_derived_class(entry: ConfigClass):
    view = getattr(importlib.import_module(fields_module(entry)), f"{entry.cls.__name__}Fields")
    hints = typing.get_type_hints(view)
    real = {f.name: f for f in dataclasses.fields(entry.cls)}
    assert [f.name for f in dataclasses.fields(view)] == list(real)
    for f in dataclasses.fields(view):
        assert f.default == real[f.name].default, f.name
    # every value a built config holds (each preset of a registered study) fits its declared annotation
    spec = next((s for s in STUDIES.values() if s.keys is entry.table), None)
    presets = spec.presets if spec is not None else {}
    for preset in presets:
        _, flat = resolve({"study": entry.table.study, "preset": preset}, STUDIES)
        try:
            cfg = entry.table.build(entry.cls, flat)
        except Exception as exc:  # a preset whose data is not on this machine still checks its defaults
            pytest.skip(f"{preset}: {exc}")
        for name, value in dataclasses.asdict(cfg).items():
            _check(value, hints[name], f"{entry.cls.__name__}.{name} = {value!r} in preset {preset}")


def test_the_check_fails_on_a_hand_edited_field(tmp_path, monkeypatch, capsys):
    """On a copy of the generated files (other tests read the real ones): one edited annotation fails --check."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sync_run_keys", ROOT / "scripts" / "sync_run_keys.py")
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    for rel in ["pyproject.toml", "docs/run_keys.md",
                *(fields_module(e).replace(".", "/") + ".py" for e in OURS)]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    monkeypatch.setattr(sync, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["sync_run_keys.py", "--check"])
    assert sync.main() == 0
    path = tmp_path / "flower_apps" / "dfl_dp" / "config_fields.py"
    text = path.read_text()
    assert "    num_clients: int = 100\n" in text
    path.write_text(text.replace("    num_clients: int = 100\n", "    num_clients: float = 100\n"))
    assert sync.main() == 1
    assert "flower_apps/dfl_dp/config_fields.py is out of date" in capsys.readouterr().err


def test_a_parse_function_without_a_return_type_is_refused():
    from flower_apps.config import Key, KeyTable

    table = KeyTable("typed-view-test", [Key("tv-x", "", str, parse=lambda s: s, doc="x")])
    with pytest.raises(TypeError, match="declares no return type"):
        table.config_class("TvConfig")
