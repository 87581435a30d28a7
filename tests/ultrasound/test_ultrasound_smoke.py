"""The smoke preset through the real Flower simulation path (Ray, virtual SuperNodes)."""

from __future__ import annotations

import json

import numpy as np

from flower_apps.common.results import read_json
from flower_apps.runner import run_config_in_process


def test_smoke_preset_runs_through_flower(tmp_path):
    # 4 logical clients on 2 SuperNodes: flwr's default local federation has fewer nodes than clients
    run_config_in_process({"study": "ultrasound", "preset": "smoke", "results-dir": str(tmp_path)}, num_supernodes=2)
    folders = list((tmp_path / "ultrasound" / "runs").iterdir())
    assert len(folders) == 1
    out = folders[0]
    s = read_json(out / "summary.json")
    assert (s["method"], s["num_clients"], s["num_rounds"], s["image_size"]) == ("fedavg", 4, 2, 32)
    assert len(s["acc_curve"]) == 2 and 0.0 <= s["test_accuracy"] <= 1.0
    assert len(s["per_client"]) == 4 and sorted(p["client"] for p in s["per_client"]) == [0, 1, 2, 3]
    assert np.asarray(s["confusion"]).sum() == s["n_test"]
    assert s["timing"]["mean_step_seconds"] > 0 and len(s["timing"]["round_seconds"]) == 2
    assert s["synthetic"] == (s["dataset"] == "synthetic-ultrasound")  # labelled whenever the fallback was used
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["clients_replied"] for r in rounds] == [4, 4]  # every logical client trained every round
    for f in ("table2_partition.md", "metrics.md", "per_client.csv", "communication.md", "confusion_matrix.png",
              "convergence.png", "rounds.jsonl", "model.json"):
        assert (out / f).is_file(), f
