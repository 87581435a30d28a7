"""The paper's remaining tables from runs: Table 11 per architecture, Tables 12-14 per task, Table 1 (epsilon vs
eta: the paper's basic composition beside the RDP accountant)."""

from __future__ import annotations

import math

import pytest

from flower_apps.common.stats import summarize
from flower_apps.ultrasound.report import _step_ratio
from flower_apps.ultrasound.report_paper import (
    PAPER_SCALE,
    dp_cost_rows,
    epsilon_rows,
    per_arch_rows,
    write_paper_tables,
)
from privacy.dpsgd import DpSgdEvent, rdp_epsilon


def row(task, arch, method, acc, auc, dp=None):
    r = {"scale": "busi 96px", "task": task, "partition": "iid", "arch": arch, "method": method, "seeds": 2,
         "accuracy (%)": f"{acc}", "auc (%)": f"{auc}", "f1 (%)": "50", "_accuracy": summarize([acc, acc]),
         "_auc": summarize([auc, auc]), "_majority": 83.33}
    if dp:
        r.update({"DP-SGD": dp, "eps RDP (max client)": "5", "eps paper sqrt(T)": "13", "step time vs no-DP": "2x"})
    return r


def test_table11_per_architecture_pairs_each_fl_method_with_its_own_backbone():
    rows = [row("three-class", "a", "Centralized", 80, 90), row("three-class", "a", "FedAvg", 75, 85),
            row("three-class", "b", "Centralized", 60, 70), row("three-class", "b", "FedProx", 65, 72),
            row("three-class", "b", "Local-only", 40, 50)]
    out = per_arch_rows(rows)
    assert [(r["arch"], r["FL method"], r["delta acc (pp)"]) for r in out] == [("a", "FedAvg", "-5.00"),
                                                                              ("b", "FedProx", "+5.00")]


def test_tables_12_to_14_split_by_task_with_the_cost_in_points():
    nodp = [row("normal-vs-abnormal", "a", "FedAvg", 90, 95), row("benign-vs-malignant", "a", "FedAvg", 80, 85)]
    dp = [row("normal-vs-abnormal", "a", "FedAvg", 84, 90, "C=1.5, z=2"),
          row("benign-vs-malignant", "a", "FedAvg", 70, 70, "C=1.5, z=2"),
          row("three-class", "a", "FedAvg", 60, 70, "C=1.5, z=2")]
    t = dp_cost_rows(nodp, dp)
    assert sorted(t) == [12, 13, 14]
    assert t[12][0]["DP cost acc (pp)"] == "+6.00" and t[12][0]["DP cost AUC (pp)"] == "+5.00"
    assert t[12][0]["no-DP seeds"] == 2  # the reader sees how many runs each side of the cost averages
    assert t[13][0]["DP cost acc (pp)"] == "+10.00"
    assert t[14][0]["DP cost acc (pp)"] == "-" and t[14][0]["no-DP seeds"] == 0  # no non-DP run: not invented


def test_table1_paper_formula_by_hand_and_rdp_from_the_accountant():
    summary = {"dataset": "busi", "image_size": 96, "num_rounds": 5, "local_epochs": 1,
               "accounting": {"delta": 1e-5, "per_client": [{"sample_rate": 0.4, "steps": 12, "eps_rdp": 3.0},
                                                             {"sample_rate": 0.25, "steps": 20, "eps_rdp": 4.0}]}}
    rows = epsilon_rows([summary], etas=(1.0, 2.0))
    assert len(rows) == 4  # the paper's scale and this run's worst client, two etas each
    paper = [r for r in rows if r["setting"].startswith("paper")]
    q = 32 / PAPER_SCALE["n_per_client"]
    steps = 500 * math.ceil(1 / q)
    assert paper[1]["steps"] == steps
    assert paper[1]["eps paper sqrt(T)"] == pytest.approx(math.sqrt(steps) * math.sqrt(2 * math.log(1.25e5)) / 2)
    run = [r for r in rows if not r["setting"].startswith("paper")]
    assert run[0]["steps"] == 20 and run[0]["q"] == "0.25"  # the max-epsilon client
    assert run[1]["eps RDP"] == pytest.approx(rdp_epsilon([DpSgdEvent(2.0, 0.25, 20)], 1e-5))
    assert run[0]["eps RDP"] > run[1]["eps RDP"]  # more noise, less epsilon
    assert all(r["eps RDP"] < r["eps paper sqrt(T)"] for r in paper)  # subsampling amplification


def test_write_paper_tables_writes_files(tmp_path):
    nodp = [row("normal-vs-abnormal", "a", "Centralized", 90, 95), row("normal-vs-abnormal", "a", "FedAvg", 88, 94)]
    dp = [row("normal-vs-abnormal", "a", "FedAvg", 84, 90, "C=1.5, z=2")]
    from flower_apps.ultrasound.report import write_table

    md = write_paper_tables(nodp, dp, [], tmp_path, write_table, "caveat")
    for stem in ("table11_per_arch", "table12_dp", "table1_epsilon"):
        assert (tmp_path / f"{stem}.csv").is_file() and (tmp_path / f"{stem}.md").is_file()
    assert (tmp_path / "figure3_epsilon_vs_eta.png").is_file()
    assert "Table 12 style" in md and "Table 1 style" in md


def test_the_step_time_ratio_says_when_it_is_not_dp_sgd_overhead():
    def run(step, trainable, cached):
        return {"num_trainable": trainable, "timing": {"mean_step_seconds": step, "trunk_cached_share": cached}}

    base = (2.0, 1000)  # the non-DP run: 2 s per step, every layer trains
    assert _step_ratio([run(5.0, 1000, 0.0), run(3.0, 1000, 0.0)], base) == "2x"  # same training: DP's overhead
    assert _step_ratio([run(0.8, 10, 0.0)], base) == "0.4x (head only)"
    assert _step_ratio([run(0.01, 10, 1.0), run(0.03, 10, None)], base) == "0.01x (head only, cached trunk)"
    assert _step_ratio([run(0.01, 10, None)], base) == "0.005x (head only)"  # an older run: cache unknown
    assert _step_ratio([run(1.0, 1000, 0.0)], None) == "-"  # no matching non-DP run: nothing invented
