"""docs/deployment.md's measured deployment tables render from their kept records, and only from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flower_apps.common import deploy_docs

LOCAL = {"benchmark": "benchmarks/deploy_vs_simulation.py", "date": "2026-12-07T21:30:00Z", "cores": 2,
         "flwr": "1.42.0", "torch": "2.14.1", "torch_threads": 2,
         "runs": [{"study": "dfl-dp", "supernodes": 2, "run_keys": {}, "deployed_wall_seconds": 50.0,
                   "simulated_wall_seconds": 10.0, "ratio": 5.0, "deployed_command_seconds": 80.4,
                   "simulated_command_seconds": 25.6, "equal": True, "differences": [],
                   "load_average_before": [0.5, 0.4, 0.3], "load_average_after": [1.9, 1.0, 0.5]},
                  {"study": "tabular-pdp", "supernodes": 3, "run_keys": {}, "deployed_wall_seconds": 200.0,
                   "simulated_wall_seconds": 20.0, "ratio": 10.0, "deployed_command_seconds": 230.0,
                   "simulated_command_seconds": 40.0, "equal": False, "differences": ["summary.json acc: 1 != 2"],
                   "load_average_before": None, "load_average_after": [2.0, 1.0, 1.0]}]}
DOCKER = {"script": "scripts/docker_federation.sh", "date": "2026-12-07T21:20:00Z", "cores": 2,
          "load_average_start": "0.84 1.17 0.75", "load_average_end": ["2.10", "1.90", "1.50"],
          "engine": "20.10.24+dfsg1", "storage_driver": "overlay2", "compose": "docker-compose version 1.29.2",
          "base_image": "ppfl/base:bookworm", "images_present_before": [], "build_cache_before": "0B",
          "seconds": {"base_image": 139.2, "wheelhouse": 78.0, "wheelhouse_reused": False, "export": 28.3,
                      "compose_up": 20.7, "images": {"ppfl/superlink:latest": 83.0, "ppfl/supernode:latest": 294.0},
                      "whole_script": 1200.0},
          "image_bytes": {"ppfl/base:bookworm": 169_000_000, "ppfl/supernode:latest": 7_020_000_000},
          "runs": [{"study": "dfl-dp", "deployed_s": 134.5, "simulated_s": 27.7, "result": "EQUAL", "diffs": []}]}


def test_the_local_table_shows_each_run_its_ratio_and_verdict():
    text = deploy_docs.local_table(LOCAL)
    assert "| dfl-dp | 2 | 10.0 s | 50.0 s | 5.0x | 26 s / 80 s | equal | 0.5, 1.9 |" in text
    assert "differ: summary.json acc: 1 != 2" in text and "| ?, 2.0 |" in text


def test_the_docker_table_says_what_was_built_from_scratch_and_the_sizes():
    text = deploy_docs.docker_table(DOCKER)
    assert "| `ppfl/supernode` (from scratch) | 4 min 54 s |" in text
    assert "| dfl-dp: deployed / simulated | 2 min 14 s / 27.7 s, equal |" in text
    assert "| `ppfl/supernode:latest` | 7.02 GB |" in text and "| `ppfl/base:bookworm` | 169 MB |" in text
    cached = deploy_docs.docker_table({**DOCKER, "images_present_before": ["ppfl/supernode:latest"]})
    assert "| `ppfl/supernode` (cache present) |" in cached


def test_the_blocks_read_the_kept_files_and_name_a_missing_one(tmp_path: Path):
    (tmp_path / "results_deploy").mkdir()
    with pytest.raises(FileNotFoundError, match="results_deploy/local_federation.json"):
        deploy_docs.BLOCKS["deploy-local-timings"](tmp_path)
    (tmp_path / deploy_docs.LOCAL).write_text(json.dumps(LOCAL))
    (tmp_path / deploy_docs.DOCKER).write_text(json.dumps(DOCKER))
    assert deploy_docs.BLOCKS["deploy-local-timings"](tmp_path) == deploy_docs.local_table(LOCAL)
    assert "7.02 GB" in deploy_docs.BLOCKS["deploy-docker-timings"](tmp_path)
