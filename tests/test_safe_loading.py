"""Every ``torch.load`` in the project passes ``weights_only=True``.

``torch.load`` without it unpickles arbitrary objects, so a model file, a ``victims.pt`` or a
checkpoint handed over by someone else runs their code on the machine that opens it. The scan
parses every ``.py`` file of the repository with ``ast`` (nothing is imported) and follows the
names ``torch`` and ``load`` are bound to (``import torch as th``, ``from torch import load``).
A call counts as safe only with the literal keyword ``weights_only=True``: a variable, ``False``
or ``**kwargs`` cannot be checked and fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import torch
from flwr.app import Message, RecordDict

from flower_apps.dfl_dp.victims import capture, extract, save

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"__pycache__", "node_modules"}  # plus every hidden directory (.venv, .git, ...)


def python_files(root: Path) -> list[Path]:
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).parts
        if any(p.startswith(".") or p in SKIP_DIRS for p in rel[:-1]):
            continue
        out.append(path)
    return sorted(out)


def unsafe_torch_loads(source: str, filename: str = "<string>") -> list[int]:
    """Line numbers of ``torch.load`` calls without a literal ``weights_only=True``."""
    tree = ast.parse(source, filename)
    torch_names, load_names = {"torch"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            torch_names |= {a.asname or a.name for a in node.names if a.name == "torch"}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch" and not node.level:
            load_names |= {a.asname or a.name for a in node.names if a.name == "load"}
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        is_load = (isinstance(f, ast.Attribute) and f.attr == "load" and isinstance(f.value, ast.Name)
                   and f.value.id in torch_names) or (isinstance(f, ast.Name) and f.id in load_names)
        if not is_load:
            continue
        safe = any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in node.keywords)
        if not safe:
            bad.append(node.lineno)
    return bad


def test_the_scan_finds_what_it_must():
    # The checker itself: it must flag every unsafe form and pass only the safe one.
    assert unsafe_torch_loads("import torch\ntorch.load('m.pt')") == [2]
    assert unsafe_torch_loads("import torch\ntorch.load('m.pt', map_location='cpu', weights_only=False)") == [2]
    assert unsafe_torch_loads("import torch\nw = True\ntorch.load('m.pt', weights_only=w)") == [3]
    assert unsafe_torch_loads("import torch\ntorch.load('m.pt', **kw)") == [2]
    assert unsafe_torch_loads("import torch as th\nth.load('m.pt')") == [2]
    assert unsafe_torch_loads("from torch import load as ld\nld('m.pt')") == [2]
    assert unsafe_torch_loads("import torch\ntorch.load('m.pt', weights_only=True)") == []
    assert unsafe_torch_loads("import json\njson.load(f)\nnp.load('x.npy')") == []


def test_no_torch_load_without_weights_only_in_the_repository():
    files = python_files(ROOT)
    assert ROOT / "tests" / "test_safe_loading.py" in files  # the walk reaches the repository's files
    assert ROOT / "flower_apps" / "dfl_dp" / "attack_eval.py" in files
    offenders = [f"{p.relative_to(ROOT)}:{line}" for p in files
                 for line in unsafe_torch_loads(p.read_text(encoding="utf-8"), str(p))]
    assert not offenders, "torch.load without weights_only=True (arbitrary unpickling): " + ", ".join(offenders)


def test_victims_file_loads_with_weights_only(tmp_path):
    """``victims.pt`` as the dfl-dp ServerApp writes it (capture -> reply -> extract -> save, plus the
    run fields server_app.py adds) holds only what ``weights_only=True`` admits."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    x, y = torch.randn(2, 1, 2, 2), torch.tensor([2, 0])
    content = RecordDict()
    capture(content, 3, model, x, y, first_batch=torch.tensor([1, 0]), part_index=np.array([10, 11]))
    reply = Message(content, dst_node_id=1, message_type="train.dfl_dp")
    records = extract([reply])
    for r in records:
        r.update(framework="fl", condition="dp", seed=0, round=1)
    save(records, tmp_path / "victims.pt")
    got = torch.load(tmp_path / "victims.pt", map_location="cpu", weights_only=True)
    assert [(r["client"], r["index"], r["label"], r["framework"]) for r in got] == [(3, 11, 0, "fl")]
    assert got[0]["gradient_names"] == ["1.weight", "1.bias"]
    for a, b in zip(got[0]["gradient"], records[0]["gradient"]):
        torch.testing.assert_close(a, b)
    assert got[0]["state"].keys() == model.state_dict().keys()
