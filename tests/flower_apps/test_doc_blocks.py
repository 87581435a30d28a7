"""The docs check (``python -m flower_apps.report --check``): generated blocks and values rebuilt from kept data.

It must pass on the repository as committed, and fail on a copy where a generated number was edited by hand,
a block is unknown or unclosed, or a registered block is used by no document.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import flower_apps.studies  # noqa: F401  (registers the studies' blocks)
from flower_apps.common import doc_blocks

ROOT = Path(__file__).resolve().parents[2]


def test_the_repository_documents_match_their_kept_data():
    problems = doc_blocks.check(ROOT)
    assert problems == [], "\n".join(map(str, problems)) + "\n(regenerate: python -m flower_apps.report --write-docs)"


def test_the_check_passes_on_what_a_clean_clone_holds(tmp_path: Path):
    """Only files git keeps (tracked, or new and not ignored): a kept table under an ignored folder fails here."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: " + listed.stderr.decode(errors="replace").strip())
    for name in listed.stdout.decode().split("\0"):
        if name.endswith(".md") or name.startswith("results_"):
            src = ROOT / name
            if src.is_file():
                (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, tmp_path / name)
    problems = doc_blocks.check(tmp_path)
    assert problems == [], "\n".join(map(str, problems)) + "\n(is a kept file git-ignored? see .gitignore)"


def test_the_command_passes_on_the_repository_and_runs_no_training():
    out = subprocess.run([sys.executable, "-m", "flower_apps.report", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "matches its data" in out.stdout


def test_a_hand_edited_value_in_prose_fails(copy: Path):
    readme = copy / "README.md"
    text = readme.read_text()
    marker = "<!--v:dfl-dp-protocol.fl.eps2.ret_mean-->"
    assert marker in text
    start = text.index(marker) + len(marker)
    end = text.index("<!--/v-->", start)
    readme.write_text(text[:start] + "99.9" + text[end:])
    problems = doc_blocks.check(copy)
    assert [(p.document, p.name) for p in problems] == [("README.md", "dfl-dp-protocol.fl.eps2.ret_mean")]
    assert "differs from its data" in problems[0].problem
    assert doc_blocks.check(copy, write=True) == []  # --write-docs repairs it
    assert readme.read_text() == text


def test_a_hand_edited_table_cell_fails(copy: Path):
    readme = copy / "README.md"
    text = readme.read_text()
    assert "| 63.82 / 63.98 / 61.73 (63.18) |" in text
    readme.write_text(text.replace("| 63.82 / 63.98 / 61.73 (63.18) |", "| 63.82 / 63.98 / 61.73 (63.19) |"))
    problems = doc_blocks.check(copy)
    assert [(p.document, p.name) for p in problems] == [("README.md", "dfl-dp-protocol-table")]


def test_a_changed_kept_run_fails_the_check(copy: Path):
    """The check reads the data: a kept summary that changes makes the documents stale."""
    runs = copy / "results_protocol"
    runs.unlink()
    shutil.copytree(ROOT / "results_protocol", runs)
    summary = runs / "dfl-dp" / "runs" / "fl_C1_eps2_N100_T100_fashion-mnist_s0" / "summary.json"
    summary.write_text(summary.read_text().replace('"final_acc": 0.6382', '"final_acc": 0.6482'))
    names = {p.name for p in doc_blocks.check(copy)}
    assert "dfl-dp-protocol-table" in names and "dfl-dp-protocol.fl.eps2.final_s0" in names


def test_unknown_unclosed_and_unused_names_fail(copy: Path):
    doc = copy / "docs" / "extra.md"
    doc.write_text("<!-- no-such-block:start -->\nx\n<!-- no-such-block:end -->\n"
                   "<!--v:no-such-space.k-->1<!--/v-->\n<!-- half-open:start -->\n")
    problems = {(p.name, p.problem.split(" (")[0].split(":")[0]) for p in doc_blocks.check(copy)}
    assert ("no-such-block", "no block of that name is registered") in problems
    assert ("no-such-space.k", "no value namespace 'no-such-space' is registered") in problems
    assert ("half-open", "start marker without its end marker") in problems
    readme = copy / "README.md"
    text = readme.read_text()
    start = text.index("<!-- dfl-dp-protocol-table:start -->")
    end = text.index("<!-- dfl-dp-protocol-table:end -->") + len("<!-- dfl-dp-protocol-table:end -->")
    readme.write_text(text[:start] + text[end:])
    assert ("dfl-dp-protocol-table", "registered block that no document uses") in {
        (p.name, p.problem) for p in doc_blocks.check(copy)}


def test_a_missing_kept_file_is_named(copy: Path):
    (copy / "results_audit").unlink()
    problems = [p for p in doc_blocks.check(copy) if p.name == "audit-detection"]
    assert problems and "results_audit/detection.md is missing" in problems[0].problem


@pytest.mark.parametrize("document, marker", [
    ("docs/tabular_pdp.md", "<!--v:tabular-pdp-reduced.det.fp-->"),
    ("docs/tabular_pdp.md", "<!--v:tabular-pdp-reduced.e2.detected-->"),
])
def test_a_hand_edited_study_value_fails(copy: Path, document: str, marker: str):
    doc = copy / document
    text = doc.read_text()
    assert marker in text
    start = text.index(marker) + len(marker)
    doc.write_text(text[:start] + "9/" + text[start:])
    problems = doc_blocks.check(copy)
    assert [(p.document, p.name) for p in problems] == [(document, marker[6:-3])]


@pytest.mark.parametrize("old, new", [
    ("| 89.74 +- 1.28 [86.56, 92.93] |", "| 89.74 +- 1.28 [86.56, 92.94] |"),  # the seeds' interval
    ("| 90.12 [78.39, 101.84] |", "| 90.12 [84.36, 95.87] |"),  # the test-sampling one, typed as the narrow one
])
def test_a_hand_edited_ultrasound_cell_fails(copy: Path, old: str, new: str):
    doc = copy / "docs" / "ultrasound.md"
    text = doc.read_text()
    block = text[text.index("<!-- ultrasound-nodp-table:start -->"):text.index("<!-- ultrasound-nodp-table:end -->")]
    assert block.count(old) == 1
    doc.write_text(text.replace(block, block.replace(old, new)))
    assert [(p.document, p.name) for p in doc_blocks.check(copy)] == [("docs/ultrasound.md", "ultrasound-nodp-table")]
