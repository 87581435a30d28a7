"""The filter that keeps Ray's metrics-agent notices off a driver's console hides those lines and nothing else."""

from __future__ import annotations

import pytest

from flower_apps.common import ray_notices
from flower_apps.common.ray_notices import hide_metrics_agent_notices, without_notices

GCS = ("[2026-12-07 20:30:08,915 E 1982 1982] (gcs_server) gcs_server.cc:961: Failed to establish connection to "
       "the event+metrics exporter agent. Events and metrics will not be exported. Exporter agent status: "
       "RpcError: Running out of retries to initialize the metrics agent. rpc_code: 14")
RAYLET = ("[2026-12-07 20:30:13,134 E 2055 2055] (raylet) main.cc:1077: Failed to establish connection to the "
          "metrics exporter agent. Metrics will not be exported.")
CRASH = "[2026-12-07 20:31:00,000 E 2055 2055] (raylet) node_manager.cc:1: worker died: SIGSEGV"


def batch(*lines: str, pid: str = "raylet") -> dict:
    return {"ip": "127.0.0.1", "pid": pid, "job": "", "is_err": True, "lines": list(lines),
            "actor_name": "", "task_name": ""}


def test_the_notices_are_dropped_and_every_other_line_kept():
    assert without_notices(batch(GCS, pid="gcs_server")) is None
    kept = without_notices(batch(RAYLET, CRASH, "actor said hello"))
    assert kept["lines"] == [CRASH, "actor said hello"] and kept["pid"] == "raylet"
    untouched = batch(CRASH)
    assert without_notices(untouched) is untouched
    assert without_notices({"no": "lines"}) == {"no": "lines"}


def test_installed_on_rays_dispatcher_it_filters_what_the_driver_prints(monkeypatch):
    from ray._private import ray_logging

    dispatcher = ray_logging.WorkerStandardStreamDispatcher()
    monkeypatch.setattr(ray_logging, "global_worker_stdstream_dispatcher", dispatcher)
    monkeypatch.setitem(ray_notices.hidden, "lines", 0)
    printed: list[list[str]] = []
    dispatcher.add_handler("test", lambda data: printed.append(data["lines"]))
    dispatcher.emit(batch(RAYLET))  # before: the notice reaches the console handler
    assert printed == [[RAYLET]]
    assert hide_metrics_agent_notices(only_if_imported=False)
    assert hide_metrics_agent_notices(only_if_imported=False)  # idempotent: wrapped once
    dispatcher.emit(batch(GCS, pid="gcs_server"))
    dispatcher.emit(batch(RAYLET, CRASH))
    assert printed == [[RAYLET], [CRASH]] and ray_notices.hidden["lines"] == 2


def test_without_ray_imported_nothing_is_installed(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert hide_metrics_agent_notices() is False


@pytest.mark.parametrize("line", [GCS, RAYLET])
def test_the_pattern_matches_both_ray_2_55_wordings(line):
    assert ray_notices.NOTICE.search(line)
