"""Learning over the networked transport: the two carriers share one config; bad settings fail before processes start."""

from __future__ import annotations

import dataclasses

import pytest

import flower_apps.studies  # noqa: F401  (registers the study keys)
from flower_apps.common.results import run_hash
from flower_apps.unlinkable_dfl import netlearn
from flower_apps.unlinkable_dfl.server_app import run_dir
from flower_apps.unlinkable_dfl.world import World


def test_simulation_and_network_runs_differ_only_in_their_run_name(tmp_path):
    cfgs = netlearn.configs(8, 2, 0, str(tmp_path))
    sim, net = cfgs["simulation"], cfgs["network"]
    assert sim.num_nodes == 8 and sim.transport == "mixnet" and sim.churn_leave == 0
    assert sim.run_name != net.run_name
    assert dataclasses.replace(sim, run_name=net.run_name) == net
    assert run_hash(sim) == run_hash(net)  # one configuration: the run name only picks the folder
    assert run_dir(sim) != run_dir(net)  # separate results folders, each resumed on its own


def test_network_world_refuses_churn_before_starting_processes(tmp_path, monkeypatch):
    cfg = dataclasses.replace(netlearn.configs(6, 1, 0, str(tmp_path))["network"], churn_leave=0.1)
    started = []
    monkeypatch.setattr("flower_apps.unlinkable_dfl.world.create_transport", lambda *a, **k: started.append(a))
    with pytest.raises(ValueError, match="without churn"):
        World(cfg, network=True)
    assert not started
