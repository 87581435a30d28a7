"""A Ray cluster left on the machine by ``ray start`` is never joined unless asked (issue 41, item 8).

``ray.init()`` without an address attaches to the cluster whose address ``ray start`` wrote to
``/tmp/ray/ray_current_cluster``; with ``num_cpus`` it then refuses ("num_cpus and num_gpus must not be
provided"), and the simulation runtime hung. Both engines now start a Ray of their own unless ``RAY_ADDRESS``
names one: the in-process engine passes ``address="local"``, the SuperLink's environment carries
``RAY_ADDRESS=local`` to each run's ``flwr-simulation``. Shown against Ray's own address resolution, with a
cluster made to look present (starting a real one without ``--temp-dir`` would capture the other tests' Ray).
"""

from __future__ import annotations

import pytest
import ray._private.services as services

from flower_apps.engine import backend_config
from flower_apps.superlink import LocalSuperLink

LEFT_BEHIND = "127.0.0.1:6399"  # what a `ray start --head` left in /tmp/ray/ray_current_cluster


@pytest.fixture
def cluster_on_machine(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir=None: LEFT_BEHIND)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: [LEFT_BEHIND])


def test_the_left_behind_cluster_is_what_ray_would_join(cluster_on_machine):
    """The detector fires: without an address Ray resolves to the cluster it found."""
    found = services.canonicalize_bootstrap_address(None)
    assert found is not None and found.endswith(":6399")  # (Ray swaps 127.0.0.1 for the machine's address)


def test_the_in_process_engine_starts_its_own_ray(cluster_on_machine):
    args = backend_config(1, 0)["init_args"]
    assert args["address"] == "local" and args["num_cpus"] >= 1
    assert services.canonicalize_bootstrap_address(args["address"]) is None  # None: start a new local Ray


def test_the_superlink_runs_start_their_own_ray(cluster_on_machine, monkeypatch, tmp_path):
    env = LocalSuperLink()._env(tmp_path)
    assert env["RAY_ADDRESS"] == "local"
    monkeypatch.setenv("RAY_ADDRESS", env["RAY_ADDRESS"])  # what flwr-simulation's ray.init() then reads
    assert services.canonicalize_bootstrap_address(None) is None


def test_a_named_cluster_is_still_joined(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    args = backend_config(1, 0)["init_args"]
    assert args["address"] == "10.0.0.5:6379" and "num_cpus" not in args
    assert LocalSuperLink()._env(tmp_path)["RAY_ADDRESS"] == "10.0.0.5:6379"
