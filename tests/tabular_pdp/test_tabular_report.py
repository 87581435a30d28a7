"""The one-run table of tabular-pdp (flower_apps/tabular_pdp/report.py)."""

from __future__ import annotations

from flower_apps.tabular_pdp.report import write_run_table


def _summary(estimate):
    return {"settings": {"vanilla": {"final_mae": 1.0, "final_mre": 0.5}}, "clip_norm": 8.5, "clip_mode": "fixed",
            "clip_norm_estimate": estimate, "noise_multiplier": 0.05, "num_rounds": 1, "local_epochs": 1,
            "participants": [0, 1]}


def test_a_run_without_a_clip_estimate_has_its_table(tmp_path):
    """Fewer than 3 clients with a fixed C: no robust estimate (None), the table says n/a (the deployed
    two-site run crashed here after training)."""
    assert "estimate n/a" in write_run_table(_summary(None), tmp_path)
    assert "estimate 1.234" in write_run_table(_summary(1.2341), tmp_path)
