"""End to end: the smoke preset through the root router and Flower's real simulation path."""

import json

import pytest

from flower_apps.common.results import read_json, read_jsonl


@pytest.mark.slow
def test_smoke_preset_through_flower_simulation(tmp_path):
    from flower_apps.runner import run_config_in_process

    run_config_in_process({"study": "unlinkable-dfl", "preset": "smoke", "results-dir": str(tmp_path)})
    (run,) = (tmp_path / "unlinkable-dfl" / "runs").iterdir()
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["num_nodes"] == 6 and cfg["mixnet"] and cfg["quantize"]
    rounds = read_jsonl(run / "rounds.jsonl")
    summary = read_json(run / "summary.json")
    assert [r["round"] for r in rounds] == [1, 2]
    assert summary["fragments_per_update"] == 7 and summary["transport"] == "mixnet"
    for r in rounds:
        # 6 nodes x 4 neighbours x 7 fragments, every one delivered through the mixnet
        assert r["payloads_intended"] == 168 and r["completeness"] == 1.0 and r["coverage"] == 1.0
        assert r["meaningful_packets_per_node"] == 56  # 28 data packets + 28 acks per node
        assert r["network_virtual_s"] > 0 and r["bytes_per_node"] > 56 * 10_240
    # training and fragment aggregation did something: well above chance (0.1) after 2 rounds
    assert summary["final_acc"] > 0.3, summary["acc_curve"]
