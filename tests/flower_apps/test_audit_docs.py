"""docs/audit.md's generated tables and numbers (flower_apps.common.audit_docs): a hand edit or a changed kept
audit run fails the docs check, and the cells are the audit report code's own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import flower_apps.studies  # noqa: F401  (registers the studies' blocks)
from flower_apps.common import audit_docs, doc_blocks
from flower_apps.dfl_dp.audit_report import audit_rows

ROOT = Path(__file__).resolve().parents[2]
AUDIT_DOC = "docs/audit.md"


def _edit_value(doc: Path, marker: str, new: str) -> str:
    text = doc.read_text()
    assert marker in text, marker
    start = text.index(marker) + len(marker)
    end = text.index("<!--/v-->", start)
    assert text[start:end] != new
    doc.write_text(text[:start] + new + text[end:])
    return text


def test_a_hand_edited_audit_number_in_prose_fails(copy: Path):
    doc = copy / AUDIT_DOC
    # the point estimate vs the ledger, the sentence issue 39 found typed wrong by hand ("11-12% below")
    text = _edit_value(doc, "<!--v:audit.reduced.fl.eps2.point_vs_formal-->", "11-12% below")
    problems = doc_blocks.check(copy)
    assert [(p.document, p.name) for p in problems] == [(AUDIT_DOC, "audit.reduced.fl.eps2.point_vs_formal")]
    assert "differs from its data" in problems[0].problem
    assert doc_blocks.check(copy, write=True) == []  # --write-docs repairs it
    assert doc.read_text() == text


@pytest.mark.parametrize("block", sorted(audit_docs.BLOCKS))
def test_a_hand_edited_audit_table_fails(copy: Path, block: str):
    doc = copy / AUDIT_DOC
    text = doc.read_text()
    start = text.index(f"<!-- {block}:start -->")
    row = text.index("\n| ", text.index("|---", start)) + 1  # the first body row of the block's table
    cell_end = text.index(" |", row + 2)
    doc.write_text(text[:cell_end] + "9" + text[cell_end:])
    assert [(p.document, p.name) for p in doc_blocks.check(copy)] == [(AUDIT_DOC, block)]


def test_a_changed_kept_audit_fails_the_check(copy: Path):
    """The check reads audit.json: a changed point estimate makes the table and the prose stale."""
    kept = copy / "results_audit"
    kept.unlink()
    shutil.copytree(ROOT / "results_audit", kept)
    path = kept / "reduced" / "dfl-dp" / "runs" / "fl_C1_eps2_N100_T20_mnist_s0_audit200" / "audit.json"
    audit = json.loads(path.read_text())
    audit["threat_models"]["all-iterates"]["eps_point"] = 7.0
    path.write_text(json.dumps(audit))
    names = {p.name for p in doc_blocks.check(copy)}
    assert {"audit-dfl-dp-reduced", "audit.reduced.fl.eps2.point",
            "audit.reduced.fl.eps2.point_vs_formal"} <= names


def test_the_dfl_dp_table_cells_are_the_audit_reports_own():
    """The generated table quotes dfl_dp.audit_report's formatted cells, not numbers of its own."""
    table = audit_docs.BLOCKS["audit-dfl-dp-reduced"](ROOT)
    for r in audit_rows(ROOT / audit_docs.REDUCED):
        assert f"| {r['eps formal (add/remove)']} |" in table
        assert f"| {r['all-iterates: point estimate']} (" in table
    values = audit_docs.audit_values(ROOT)
    assert values["reduced.fl.eps2.point_vs_formal"] == "4.8% above"  # 9.496 vs 9.0625 in the kept audit.json
    assert values["reduced.fl.eps8.point_vs_formal"] == "8.1% below"  # 53.26 vs 57.97


def test_a_missing_kept_audit_run_is_named(copy: Path):
    kept = copy / "results_audit"
    kept.unlink()
    shutil.copytree(ROOT / "results_audit", kept)
    shutil.rmtree(kept / "smoke" / "tabular-pdp")
    problems = {p.name: p.problem for p in doc_blocks.check(copy)}
    assert "no audited tabular-pdp runs under results_audit/smoke/tabular-pdp/runs" in problems[
        "audit-tabular-pdp-smoke"]
