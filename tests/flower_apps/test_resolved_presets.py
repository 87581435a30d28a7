"""Every preset of every study resolves to the same config as before the one-key-table refactor.

golden/resolved_presets.json was written from ``asdict(prepare({"study": s, "preset": p})[1])``
BEFORE the run keys moved into flower_apps/config.py's table. The only intended differences are
listed in FIELD_CHANGES (a field added or renamed, no value changed); anything else is a regression.
Presets added since are kept as they resolved when added in golden/added_presets.json, written by
``python scripts/golden_presets.py`` (which never rewrites a kept entry).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from flower_apps.router import prepare
from flower_apps.studies import BUILTIN_STUDIES, STUDIES

GOLDEN = json.loads((Path(__file__).parent / "golden" / "resolved_presets.json").read_text())
_ADDED_FILE = Path(__file__).parent / "golden" / "added_presets.json"
ADDED = json.loads(_ADDED_FILE.read_text()) if _ADDED_FILE.is_file() else {}

# study -> (renamed fields old -> new, fields added with their value for every preset)
_AUDIT_AND_NODE_DATA = {"audit_canaries": 0, "node_local_data": False}  # issues 13 and 15: off by default
FIELD_CHANGES = {
    # issue 15: the coordinator's evaluation file in a deployment; "" = the simulated split
    "dfl-dp": ({}, {**_AUDIT_AND_NODE_DATA, "eval_data_path": ""}),
    # round-timeout now reaches every study's ServerApp (wall seconds, the common key's default)
    "tabular-pdp": ({}, {"round_timeout": 3600.0, **_AUDIT_AND_NODE_DATA}),
    # issue 16: DP fine-tuning keeps pretrained BatchNorm frozen by default (was: GroupNorm swap)
    "ultrasound": ({}, {"round_timeout": 3600.0, "dp_finetune": "frozen-bn", **_AUDIT_AND_NODE_DATA,
                        "audit_canary": "random-pixels", "eval_data_path": "",
                        "head_init": "timm",  # issue 16: optional zero-initialised head
                        "channels_last": False,  # issue 16: memory layout (speed only, not in the run hash)
                        "noise_mode": "secure"}),  # issue 36: DP-SGD noise from each node's own source
    # udfl-round-timeout is virtual time; round_timeout is the common wall-clock wait
    "unlinkable-dfl": ({"round_timeout": "virtual_round_timeout"},
                       {"round_timeout": 3600.0, "node_local_data": False, "eval_data_path": ""}),
}

# issue 37: the studies with a DP mechanism carry dp-fault ('' = the correct mechanism; out of the run hash)
for _study in ("dfl-dp", "tabular-pdp", "ultrasound"):
    FIELD_CHANGES[_study][1]["dp_fault"] = ""

# issue 40: dfl-dp's client sampling, off by default (full participation, the seed paper's setting)
FIELD_CHANGES["dfl-dp"][1].update(client_fraction=1.0, client_sampling="poisson")

# issue 36: every study's config carries the rerun key (a finished run is kept unless 'replace'; not in the run hash)
ADDED_EVERYWHERE = {"rerun": "refuse"}


# preset -> values deliberately changed (a preset redefined by an issue, not a refactor)
PRESET_CHANGES = {
    # issue 17: the protocol grid sends all 100 clients in one message (fastest transport, same mathematics)
    "dfl-dp/protocol-fashion": {"clients_per_message": 100},
    # issue 16: the CPU preset trains the offline-pretrained EfficientNet-Lite0 at 160 px, T = 10, E = 3
    # (was 96 px, T = 5, E = 1: below the majority baseline; docs/ultrasound.md)
    "ultrasound/cpu": {"arch": "efficientnet_lite0", "num_rounds": 10, "image_size": 160, "local_epochs": 3,
                       "channels_last": True},  # 1.5x faster non-DP training on CPU, same mathematics
}


def _expected(study: str, golden: dict, name: str = "") -> dict:
    renamed, added = FIELD_CHANGES.get(study, ({}, {}))
    out = {renamed.get(k, k): v for k, v in golden.items()}
    return {**out, **added, **ADDED_EVERYWHERE, **PRESET_CHANGES.get(name, {})}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_preset_resolves_to_the_golden_config(name):
    study, preset = name.split("/")
    _, cfg = prepare({"study": study, "preset": preset})
    got = json.loads(json.dumps(asdict(cfg)))  # tuples -> lists, as in the golden file
    assert got == _expected(study, GOLDEN[name], name)


def test_added_presets_resolve_as_when_they_were_added():
    for name, kept in ADDED.items():
        study, preset = name.split("/")
        assert json.loads(json.dumps(asdict(prepare({"study": study, "preset": preset})[1]))) == kept, name


def test_golden_script_adds_a_new_preset_and_never_rewrites_a_kept_one(tmp_path, monkeypatch, capsys):
    import importlib.util
    from dataclasses import replace

    path = Path(__file__).resolve().parents[2] / "scripts" / "golden_presets.py"
    spec = importlib.util.spec_from_file_location("golden_presets", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "ADDED", tmp_path / "added.json")
    (tmp_path / "added.json").write_text(json.dumps({"dfl-dp/kept": {"x": 1}}))
    dfl = STUDIES["dfl-dp"]
    monkeypatch.setitem(STUDIES, "dfl-dp", replace(dfl, presets={**dfl.presets, "new": {"num-rounds": 3},
                                                                 "kept": {}}))
    assert script.main(["--check"]) == 1 and "preset dfl-dp/new has no golden config" in capsys.readouterr().err
    assert script.main([]) == 0
    added = json.loads((tmp_path / "added.json").read_text())
    assert added["dfl-dp/kept"] == {"x": 1} and added["dfl-dp/new"]["num_rounds"] == 3
    assert script.main(["--check"]) == 0


def test_golden_files_cover_every_builtin_study_and_preset():
    """A new preset of a built-in study needs its golden entry: ``python scripts/golden_presets.py``."""
    import subprocess
    import sys

    expected = sorted(f"{s}/{p}" for s in BUILTIN_STUDIES for p in STUDIES[s].presets)
    assert sorted({*GOLDEN, *ADDED}) == expected
    script = Path(__file__).resolve().parents[2] / "scripts" / "golden_presets.py"
    assert subprocess.run([sys.executable, str(script), "--check"], capture_output=True).returncode == 0
