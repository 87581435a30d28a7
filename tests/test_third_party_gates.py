"""Third-party internals live behind one adapter per library, each gated on the versions pyproject.toml pins.

* ``registry.third_party.VersionGate``: the specifier arithmetic, the error (library, tested version, what to
  do), the cosmetic warning;
* each adapter's gate is its library's pin in pyproject.toml, and an untested version stops the real code
  path that reads the internals (Opacus' fast DP-SGD, timm's ViT token fix, Flower's mean / clip / parser);
* no module outside the adapters reads a private name of Opacus, Flower or timm, imports a non-public
  Flower module, or swaps the class of a live object (an AST scan; a planted file shows it fires).
"""

from __future__ import annotations

import ast
import re
import tomllib
import warnings
from pathlib import Path

import pytest

from registry import third_party
from registry.third_party import UntestedVersionError, VersionGate, satisfies

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = {"privacy/dpsgd/opacus_adapter.py", "privacy/dpsgd/timm_adapter.py", "strategies/flwr_adapter.py"}
PACKAGES = ("flower_apps", "strategies", "privacy", "mixnet", "models", "datasets", "attacks", "registry",
            "deploy", "benchmarks", "scripts")
#: Flower's public API (what its packages export); any other flwr module is an internal
FLWR_PUBLIC = {"flwr", "flwr.app", "flwr.serverapp", "flwr.serverapp.strategy", "flwr.clientapp", "flwr.simulation"}
#: private names of the three libraries that the project once read (issue 38), as attributes or overrides
PRIVATE_NAMES = {"_check_processed_flag", "_mark_as_processed", "_step_skip_queue", "_adjusted_noise_multiplier",
                 "_forward_counter", "_current_grad_sample", "_norm_sample", "_close", "_compute_deltat_and_mt",
                 "_task_id", "_run_id", "_node_id", "_pos_embed", "_module", "_message_id"}


def _gates() -> dict[str, VersionGate]:
    from privacy.dpsgd.opacus_adapter import OPACUS
    from privacy.dpsgd.timm_adapter import TIMM
    from strategies.flwr_adapter import FLWR

    return {"opacus": OPACUS, "timm": TIMM, "flwr": FLWR}


@pytest.mark.parametrize("version,spec,ok", [
    ("1.6.0", "==1.6.0", True), ("1.6", "==1.6.0", True), ("1.6.1", "==1.6.0", False), ("1.6.0+cpu", "==1.6.0", True),
    ("1.0.31", ">=1.0,<2", True), ("2.0.0", ">=1.0,<2", False), ("0.9.16", ">=1.0,<2", False),
    ("1.42.0", "==1.42.0", True), ("1.43.0", "==1.42.0", False), ("1.10", ">1.9", True), ("1.5", "!=1.5.0", False),
])
def test_version_specifiers_compare_release_numbers(version, spec, ok):
    assert satisfies(version, spec) is ok


def test_a_malformed_specifier_fails_when_the_gate_is_declared():
    with pytest.raises(ValueError, match="unsupported"):
        VersionGate("opacus", "~=1.6", adapter="a.py", tests="t.py")


def test_an_untested_version_raises_naming_library_tested_version_and_what_to_do(monkeypatch):
    gate = VersionGate("opacus", "==1.6.0", adapter="privacy/dpsgd/opacus_adapter.py", tests="tests/x.py")
    monkeypatch.setattr(third_party, "installed_version", lambda dist: "1.7.0")
    with pytest.raises(UntestedVersionError) as err:
        gate.require("the copy-free optimizer")
    text = str(err.value)
    for part in ("the copy-free optimizer", "opacus==1.6.0", "opacus 1.7.0", "Install opacus==1.6.0", "tests/x.py",
                 "privacy/dpsgd/opacus_adapter.py"):
        assert part in text, part
    monkeypatch.setattr(third_party, "installed_version", lambda dist: None)
    with pytest.raises(UntestedVersionError, match=r"\(none\)"):
        gate.require("x")
    monkeypatch.setattr(third_party, "installed_version", lambda dist: "1.6.0")
    gate.require("x")  # the tested version passes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gate.warn("x") is True


def test_a_cosmetic_access_only_warns(monkeypatch):
    gate = VersionGate("flwr", "==1.42.0", adapter="a.py", tests="t.py")
    monkeypatch.setattr(third_party, "installed_version", lambda dist: "1.50.0")
    with pytest.warns(RuntimeWarning, match="flwr==1.42.0"):
        assert gate.warn("the logger name") is False


def _pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for dep in deps:
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)$", dep)
        assert m is not None, dep
        out[m.group(1).lower()] = m.group(3).replace(" ", "")
    return out


@pytest.mark.parametrize("library", ["opacus", "timm", "flwr"])
def test_each_adapter_gate_is_the_pyproject_pin_and_the_installed_version_passes(library):
    gate = _gates()[library]
    assert gate.distribution == library
    assert gate.tested == _pins()[library]
    assert gate.supported(), f"installed {library} {gate.installed()} is outside {gate.tested}"
    assert (ROOT / gate.adapter).is_file()
    for test in re.findall(r"tests/\S+\.py", gate.tests):
        assert (ROOT / test).is_file(), test


def _untested(monkeypatch, library: str, version: str) -> None:
    real = third_party.installed_version
    monkeypatch.setattr(third_party, "installed_version", lambda dist: version if dist == library else real(dist))


def test_an_untested_opacus_stops_the_fast_dp_sgd_path(monkeypatch):
    import torch
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from torch import nn

    from privacy.dpsgd import FastGhostClippingModule, FastGradSampleModule, make_private
    from privacy.dpsgd.engine import CopyFreeFastGradientClippingOptimizer

    _untested(monkeypatch, "opacus", "1.7.0")
    model = nn.Linear(3, 2)
    with pytest.raises(UntestedVersionError, match="make_private"):
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), 4, 2, noise_multiplier=1.0, max_grad_norm=1.0)
    with pytest.raises(UntestedVersionError, match="FastGradSampleModule"):
        FastGradSampleModule(nn.Linear(3, 2))
    with pytest.raises(UntestedVersionError, match="FastGhostClippingModule"):
        FastGhostClippingModule(nn.Linear(3, 2), max_grad_norm=1.0)
    with pytest.raises(UntestedVersionError, match="CopyFree"):
        CopyFreeFastGradientClippingOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                                              max_grad_norm=1.0, expected_batch_size=2)
    DPOptimizerFastGradientClipping(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                                    max_grad_norm=1.0, expected_batch_size=2)  # stock Opacus is not gated


def test_an_untested_timm_stops_the_vit_token_fix(monkeypatch):
    import timm

    from privacy.dpsgd import make_opacus_compatible

    vit = timm.create_model("vit_small_patch16_224", img_size=32, depth=1, num_classes=3)
    _untested(monkeypatch, "timm", "2.0.0")
    with pytest.raises(UntestedVersionError, match="timm>=1.0,<2"):
        make_opacus_compatible(vit)


def test_an_untested_flwr_stops_the_internals_and_warns_for_the_logger_name(monkeypatch):
    from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

    from strategies import flwr_adapter

    _untested(monkeypatch, "flwr", "1.43.0")
    rec = RecordDict({"arrays": ArrayRecord({"x": Array(__import__("numpy").ones(2))}),
                      "metrics": MetricRecord({"num-examples": 1})})
    for call in (lambda: flwr_adapter.weighted_mean_arrays([rec], "num-examples"),
                 lambda: flwr_adapter.is_fedopt(object()), lambda: flwr_adapter.flower_stdv(1.0, 1.0, 2),
                 lambda: flwr_adapter.flower_clip_model_update([], [], 1.0),
                 lambda: flwr_adapter.parse_run_config(["a=1"])):
        with pytest.raises(UntestedVersionError, match="flwr==1.42.0"):
            call()
    with pytest.raises(UntestedVersionError):
        with flwr_adapter.task_identity():
            pass
    with pytest.warns(RuntimeWarning, match="flwr==1.42.0"):
        assert flwr_adapter.flower_logger_name() == "flwr"


# -- the scan ------------------------------------------------------------------------------------------------

def private_accesses(path: Path, rel: str) -> list[str]:
    """What ``path`` reads of the three libraries' internals: private names imported, non-public Flower
    modules, known private attributes read / written / overridden, ``__class__`` assignments."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top in ("opacus", "flwr", "timm") and any(a.name.startswith("_") for a in node.names):
                out.append(f"{rel}:{node.lineno} from {node.module} import _...")
            if top == "flwr" and node.module not in FLWR_PUBLIC:
                out.append(f"{rel}:{node.lineno} from {node.module} (not Flower's public API)")
        elif isinstance(node, ast.Import):
            out += [f"{rel}:{node.lineno} import {a.name} (not Flower's public API)" for a in node.names
                    if a.name.split(".")[0] == "flwr" and a.name not in FLWR_PUBLIC]
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE_NAMES:
            out.append(f"{rel}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.FunctionDef) and node.name in PRIVATE_NAMES:
            out.append(f"{rel}:{node.lineno} def {node.name} (overrides a library's private method)")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "__class__" for t in targets):
                out.append(f"{rel}:{node.lineno} .__class__ = (swaps the class of a live object)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "__class__":
            out.append(f"{rel}:{node.lineno} setattr(..., '__class__', ...)")
    return out


def _project_files(root: Path):
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")) if (root / pkg).is_dir() else ():
            yield path, path.relative_to(root).as_posix()


def test_no_module_outside_the_adapters_reads_third_party_internals():
    found = [hit for path, rel in _project_files(ROOT) if rel not in ADAPTERS for hit in private_accesses(path, rel)]
    assert found == [], "\n".join(found)


def test_the_adapters_hold_the_accesses_the_scan_looks_for():
    """The scan is not blind: run over the adapters, it finds what they are for."""
    hits = {rel: private_accesses(ROOT / rel, rel) for rel in ADAPTERS}
    assert any("opacus.optimizers.optimizer import _" in h for h in hits["privacy/dpsgd/opacus_adapter.py"])
    assert any("._forward_counter" in h for h in hits["privacy/dpsgd/opacus_adapter.py"])
    assert any("strategy_utils" in h for h in hits["strategies/flwr_adapter.py"])
    assert any("def _compute_deltat_and_mt" in h for h in hits["strategies/flwr_adapter.py"])
    assert any("._task_id" in h for h in hits["strategies/flwr_adapter.py"])


def test_the_scan_finds_planted_private_accesses(tmp_path):
    (tmp_path / "privacy").mkdir()
    (tmp_path / "privacy" / "bad.py").write_text(
        "from opacus.optimizers.optimizer import _mark_as_processed\n"
        "from flwr.common.logger import LOGGER_NAME\n"
        "import flwr.supercore.task_identity\n"
        "from flwr.app import Message\n"  # public: not a hit
        "def f(opt, model, cls):\n"
        "    opt._step_skip_queue.append(True)\n"
        "    model.__class__ = cls\n"
        "    setattr(model, '__class__', cls)\n"
        "class V:\n"
        "    def _pos_embed(self, x):\n"
        "        return x\n")
    hits = [h for path, rel in _project_files(tmp_path) for h in private_accesses(path, rel)]
    assert len(hits) == 7, hits
    assert not any("flwr.app" in h for h in hits)
