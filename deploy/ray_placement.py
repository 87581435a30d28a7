"""Where Flower's ClientApp actors ran on a Ray cluster, read from the cluster's GCS (issue 41, item 9).

Ray's state API (``ray list actors``, ``ray.util.state``) needs the dashboard, which plain ``ray`` (what
``flwr[simulation]`` installs) does not have and which this project does not start (its HTTP API runs
code for whoever reaches it). The GCS itself keeps an actor table, dead actors included (Ray keeps up
to ``RAY_maximum_gcs_destroyed_actor_cached_count``, 100,000 by default), which any driver can read.
This module attaches as a short-lived driver, reads that table, the node table and the job table, and
reports, per job (one simulation run = one Ray job), how many ``ClientAppActor`` actors each node
hosted. It is the cluster's own record (the GCS), not what a ClientApp says about itself.

    python -m deploy.ray_placement --address <head>:<port>             # every job with ClientApp actors
    python -m deploy.ray_placement --address <head>:<port> --json placement.json

Run it during a run or after it, while the cluster is up (the GCS forgets everything when the head
stops). Uses ``ray._private.state`` (the GCS tables behind ``ray.nodes()``): checked with Ray 2.55.1; a
Ray without it gets a clear error.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

ACTOR_CLASS = "ClientAppActor"  # flwr/simulation/ray_transport/ray_actor.py


class PlacementError(RuntimeError):
    pass


def summarize(actors: dict[str, dict], jobs: list[dict], nodes: list[dict],
              actor_class: str = ACTOR_CLASS) -> dict[str, Any]:
    """Pure part: the GCS tables (as ``ray._private.state`` returns them) -> per-job actor counts per node."""
    node_ip = {n["NodeID"]: n.get("NodeManagerAddress", "") for n in nodes}
    per_job: dict[str, Counter] = {}
    for a in actors.values():
        if a.get("ActorClassName") != actor_class:
            continue
        per_job.setdefault(a["JobID"], Counter())[a["Address"]["NodeID"]] += 1
    job_info = {j["JobID"]: j for j in jobs}
    out_jobs = []
    for job_id in sorted(per_job):
        j = job_info.get(job_id, {})
        out_jobs.append({
            "job_id": job_id, "driver_pid": j.get("DriverPid"), "finished": bool(j.get("IsDead")),
            "entrypoint": j.get("Entrypoint", ""),
            "actors_per_node": dict(sorted(per_job[job_id].items())),
        })
    return {"actor_class": actor_class,
            "nodes": [{"node_id": n["NodeID"], "ip": n.get("NodeManagerAddress", ""), "alive": bool(n.get("Alive"))}
                      for n in nodes],
            "jobs": out_jobs,
            "unknown_nodes": sorted({nid for j in out_jobs for nid in j["actors_per_node"]} - set(node_ip))}


def placement(address: str, actor_class: str = ACTOR_CLASS) -> dict[str, Any]:
    """Attach to the cluster at ``address`` as a driver, read its GCS tables, detach."""
    import ray

    if ray.is_initialized():
        raise PlacementError("this process is already attached to Ray; run the placement report from its own "
                             "process (python -m deploy.ray_placement)")
    try:
        from ray._private import state
        read_actors, read_jobs = state.actors, state.jobs
    except (ImportError, AttributeError) as exc:
        raise PlacementError(f"Ray {ray.__version__} has no ray._private.state actor/job tables ({exc}); "
                             "this report was written for Ray 2.55") from exc
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as exc:  # ray.init would retry for minutes
        raise PlacementError(f"no Ray GCS reachable at {address!r} ({exc}); give the head's <host>:<port>") from exc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # Ray's accelerator-env-var tip on every init
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise PlacementError(f"no Ray cluster reachable at {address}: {exc}") from exc
    try:
        me = ray.get_runtime_context().get_job_id()
        report = summarize(read_actors(), [j for j in read_jobs() if j["JobID"] != me], ray.nodes(), actor_class)
    finally:
        ray.shutdown()
    report["address"] = address
    return report


def render(report: dict[str, Any]) -> str:
    nodes = {n["node_id"]: n for n in report["nodes"]}
    lines = [f"Ray cluster {report['address']}: {len(nodes)} nodes, "
             f"{len(report['jobs'])} jobs with {report['actor_class']} actors"]
    for n in report["nodes"]:
        lines.append(f"  node {n['node_id'][:12]}  {n['ip']:<15}  {'alive' if n['alive'] else 'dead'}")
    for j in report["jobs"]:
        state = "finished" if j["finished"] else "running"
        lines.append(f"job {j['job_id']} (driver pid {j['driver_pid']}, {state}): "
                     f"{sum(j['actors_per_node'].values())} actors")
        for nid, count in j["actors_per_node"].items():
            ip = nodes.get(nid, {}).get("ip", "?")
            lines.append(f"  node {nid[:12]}  {ip:<15}  {count} actors")
    if not report["jobs"]:
        lines.append(f"no {report['actor_class']} actors recorded (no simulation ran on this cluster since its head started)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.ray_placement", description=__doc__.split("\n")[0])
    p.add_argument("--address", required=True, help="the head's GCS address, <host>:<port>")
    p.add_argument("--actor-class", default=ACTOR_CLASS)
    p.add_argument("--json", help="also write the report as JSON to this file")
    args = p.parse_args(argv)
    try:
        report = placement(args.address, args.actor_class)
    except PlacementError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render(report))
    if args.json:
        from flower_apps.common.results import atomic_write_json

        atomic_write_json(Path(args.json), report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
