"""benchmarks/audit_detection.py: resumable log, rates with exact intervals, report-only (fake trials).

The real trials run in each study's audit tests (tests/flower_apps/test_dfl_dp_audit_verdict.py,
tests/tabular_pdp/test_tabular_audit_verdict.py, tests/ultrasound/test_ultrasound_audit_verdict.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if sys.path[:1] != [str(REPO)]:  # Opacus installs a top-level package named `benchmarks` too
    sys.path.insert(0, str(REPO))

import benchmarks.audit_detection as ad  # noqa: E402
from privacy.faults import ALLOW_ENV, FAULTS_BY_STUDY  # noqa: E402


def fake_seed(calls):
    def run_seed(study, preset, unit, faults, seed, replay=False):
        calls.append((study, preset, unit, seed))
        assert not replay
        assert os.environ.get(ALLOW_ENV) == "1"  # the broken mechanisms are the benchmark's inputs
        # a fake audit: every fault flagged except skip-clip at odd seeds; the correct mechanism flagged at seed 3
        return [ad._trial_row(study, preset, unit, f, seed,
                              {"verdict": "violation" if (f and not (f == "skip-clip" and seed % 2))
                               or (not f and seed == 3) else "consistent", "fired": ["measured-noise"] if f else []},
                              1.0) for f in faults]
    return run_seed


def test_trials_are_logged_and_a_rerun_skips_them(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    calls = []
    monkeypatch.setattr(ad, "run_seed", fake_seed(calls))
    log = tmp_path / "d.jsonl"
    rows = ad.run(["dfl-dp"], ["smoke"], {"smoke": 4}, ["fl"], log, say=lambda s: None)
    assert len(calls) == 4 and len(rows) == 4 * (1 + len(FAULTS_BY_STUDY["dfl-dp"]))
    assert ALLOW_ENV not in os.environ  # restored
    with log.open("a") as f:
        f.write('{"study": "dfl-dp", "cut sh')  # a crash mid-line loses only that line
    again = ad.run(["dfl-dp"], ["smoke"], {"smoke": 5}, ["fl"], log, say=lambda s: None)
    assert [c[3] for c in calls] == [0, 1, 2, 3, 4]  # only the new seed ran
    assert len(again) == 5 * (1 + len(FAULTS_BY_STUDY["dfl-dp"]))
    by = {r["fault"]: r for r in ad.rates(again)}
    assert by["correct"]["violations"] == 1 and by["correct"]["rate"] == pytest.approx(0.2)
    assert not by["correct"]["met"]  # 20% false positives > 5%
    assert by["skip-clip"]["violations"] == 3 and not by["skip-clip"]["met"]
    assert by["noise-div-10"]["rate"] == 1.0 and by["noise-div-10"]["met"]
    lo, hi = by["noise-div-10"]["ci"]
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 5))  # exact interval for 5 of 5


def test_clopper_pearson_known_values():
    assert ad.clopper_pearson(0, 20) == (0.0, pytest.approx(0.1684, abs=1e-4))
    assert ad.clopper_pearson(20, 20) == (pytest.approx(0.8316, abs=1e-4), 1.0)
    lo, hi = ad.clopper_pearson(1, 20)
    assert lo == pytest.approx(0.00127, abs=1e-5) and hi == pytest.approx(0.2487, abs=1e-4)


def test_report_only_reads_the_log_and_fails_on_a_missed_target(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ad, "run_seed", fake_seed([]))
    log = tmp_path / "d.jsonl"
    ad.run(["tabular-pdp"], ["smoke"], {"smoke": 2}, ["fl"], log, say=lambda s: None)
    assert ad.main(["--studies", "tabular-pdp", "--seeds", "2", "--log", str(log), "--report-only"]) == 1
    out = capsys.readouterr().out
    assert "skip-clip" in out and "NO" in out
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert {r["fault"] for r in lines} == {"", *FAULTS_BY_STUDY["tabular-pdp"]}
    # seed 0 alone: every fault flagged, the correct mechanism not: every target met
    assert ad.main(["--studies", "tabular-pdp", "--seeds", "1", "--log", str(log), "--report-only", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| study |") and "**no**" not in out


def test_report_only_refuses_a_missing_log(tmp_path):
    with pytest.raises(SystemExit):
        ad.main(["--report-only", "--log", str(tmp_path / "none.jsonl")])


def test_fired_tests_of_each_study_layout():
    assert ad.fired_tests({"verdict_detail": {"fired": ["b", "a"]}}) == ["a", "b"]
    assert ad.fired_tests({"fired": ["measured-noise"]}) == ["measured-noise"]
    tab = {"gdp": {"clients": {"0": {"verdict": {"fired": ["member-noise"]}}, "all": {"verdict": {"fired": []}}}},
           "pdp": {"clients": {}}}
    assert ad.fired_tests(tab) == ["gdp:0:member-noise"]


def test_replayed_trials_are_logged_and_counted_apart(tmp_path, monkeypatch):
    calls = []

    def run_seed(study, preset, unit, faults, seed, replay=False):
        calls.append(replay)
        return [ad._trial_row(study, preset, unit, f, seed, {"verdict": "violation" if f else "consistent"}, 1.0,
                              "replay" if replay and f else "retrain") for f in faults]

    monkeypatch.setattr(ad, "run_seed", run_seed)
    log = tmp_path / "d.jsonl"
    ad.run(["dfl-dp", "tabular-pdp"], ["reduced"], {"reduced": 2}, ["fl"], log, say=lambda s: None)
    assert calls == [True, True, False, False]  # dfl-dp replays at reduced by default; tabular-pdp retrains
    rows = ad.read_log(log)
    assert {(r["study"], r["fault"] == "", r["mode"]) for r in rows} == {
        ("dfl-dp", True, "retrain"), ("dfl-dp", False, "replay"), ("tabular-pdp", True, "retrain"),
        ("tabular-pdp", False, "retrain")}
    ad.run(["dfl-dp"], ["reduced"], {"reduced": 2}, ["fl"], log, say=lambda s: None)
    assert len(calls) == 4  # logged: nothing reruns
    ad.run(["dfl-dp"], ["reduced"], {"reduced": 1}, ["fl"], log, say=lambda s: None, replay="none")
    assert calls[-1] is False  # retraining is another trial than a replay: it runs
    counted = {(r["fault"], r["mode"]): r["n"] for r in ad.rates(ad.read_log(log)) if r["study"] == "dfl-dp"}
    assert counted[("correct", "retrain")] == 2  # seed 0's correct run, trained twice, counts once
    modes = set(counted)
    assert ("noise-div-2", "replay") in modes and ("noise-div-2", "retrain") in modes


def test_the_doc_block_is_written_from_the_log_and_checked(tmp_path, monkeypatch):
    monkeypatch.setattr(ad, "run_seed", fake_seed([]))
    log = tmp_path / "d.jsonl"
    ad.run(["tabular-pdp"], ["smoke"], {"smoke": 1}, ["fl"], log, say=lambda s: None)
    doc = tmp_path / "audit.md"
    doc.write_text(f"intro\n{ad.DOC_START}\nold\n{ad.DOC_END}\noutro\n")
    common = ["--studies", "tabular-pdp", "--seeds", "1", "--log", str(log), "--report-only"]
    assert ad.main(common + ["--check-doc", str(doc)]) == 1  # stale
    assert ad.main(common + ["--write-doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "| tabular-pdp |" in text and "old" not in text
    assert ad.main(common + ["--check-doc", str(doc)]) == 0
    with pytest.raises(SystemExit):
        ad.main(["--write-doc", str(doc)])  # only from a log


def test_docs_audit_detection_table_is_the_kept_logs():
    # docs/audit.md's detection table is generated from results_audit/detection.jsonl (no training here)
    log = REPO / "results_audit" / "detection.jsonl"
    assert log.is_file(), "the kept detection log is part of the repository"
    assert ad.main(["--log", str(log), "--report-only", "--presets", "smoke", "reduced",
                    "--check-doc", str(REPO / "docs" / "audit.md")]) == 0
