"""deploy.ray_placement: GCS tables -> ClientApp actors per node and job, and its refusals."""

from __future__ import annotations

from deploy import ray_placement
from deploy.ray_placement import PlacementError, render, summarize

A, B = "a" * 56, "b" * 56


def actor(job: str, node: str, cls: str = "ClientAppActor") -> dict:
    return {"ActorClassName": cls, "JobID": job, "State": "DEAD", "Address": {"NodeID": node, "IPAddress": "10.0.0.1"}}


def test_actors_are_counted_per_job_and_node_and_other_classes_ignored():
    actors = {str(i): a for i, a in enumerate([actor("01000000", A), actor("01000000", B), actor("01000000", B),
                                                actor("02000000", A), actor("02000000", A, cls="Other")])}
    jobs = [{"JobID": "01000000", "DriverPid": 7, "IsDead": True, "Entrypoint": "flwr-simulation"},
            {"JobID": "02000000", "DriverPid": 8, "IsDead": False}]
    nodes = [{"NodeID": A, "NodeManagerAddress": "10.0.0.1", "Alive": True},
             {"NodeID": B, "NodeManagerAddress": "10.0.0.2", "Alive": True}]
    r = summarize(actors, jobs, nodes)
    assert [j["actors_per_node"] for j in r["jobs"]] == [{A: 1, B: 2}, {A: 1}]
    assert r["jobs"][0]["finished"] and not r["jobs"][1]["finished"] and r["unknown_nodes"] == []
    r["address"] = "10.0.0.1:6379"
    text = render(r)
    assert "job 01000000 (driver pid 7, finished): 3 actors" in text and "10.0.0.2         2 actors" in text


def test_an_actor_on_a_node_the_node_table_lacks_is_reported():
    r = summarize({"x": actor("01000000", B)}, [], [{"NodeID": A, "NodeManagerAddress": "h", "Alive": True}])
    assert r["unknown_nodes"] == [B]


def test_an_unreachable_address_is_refused_at_once(capsys):
    assert ray_placement.main(["--address", "127.0.0.1:1"]) == 2
    assert "no Ray GCS reachable at '127.0.0.1:1'" in capsys.readouterr().err


def test_a_malformed_address_is_refused():
    try:
        ray_placement.placement("no-port-here")
    except PlacementError as exc:
        assert "no-port-here" in str(exc)
    else:
        raise AssertionError("accepted an address without a port")
