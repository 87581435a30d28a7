"""docs/deployment.md's measured tables, rendered from the kept records in ``results_deploy/``.

* ``deploy-local-timings``: ``results_deploy/local_federation.json``, written by
  ``python benchmarks/deploy_vs_simulation.py --keep results_deploy/local_federation.json`` (a loopback
  deployment against the in-process simulation of the same run keys);
* ``deploy-docker-timings``: ``results_deploy/docker_federation.json``, written by
  ``TIMINGS=results_deploy/docker_federation.json scripts/docker_federation.sh`` (images built offline,
  the three-SuperNode Docker federation, each study against its simulation).

Pure: each function reads one kept JSON file; ``python -m flower_apps.report --check`` compares the documents
with what they render.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LOCAL = "results_deploy/local_federation.json"
DOCKER = "results_deploy/docker_federation.json"


def _load(root: Path, rel: str) -> dict[str, Any]:
    path = root / rel
    if not path.is_file():
        raise FileNotFoundError(f"kept record {rel} is missing")
    return json.loads(path.read_text())


def _load_avg(x: Any) -> str:
    if isinstance(x, str):
        x = x.split()
    return f"{float(x[0]):.1f}" if x else "?"


def _verdict(equal: bool, diffs: list[str]) -> str:
    return "equal" if equal else ("differ: " + "; ".join(diffs)[:200]).replace("|", "\\|")  # a table cell


def local_table(record: dict[str, Any]) -> str:
    """The deployed-vs-simulated table of one benchmarks/deploy_vs_simulation.py record."""
    lines = ["| study | SuperNodes | simulated (`wall_seconds`) | deployed (`wall_seconds`) | deployed / simulated | "
             "whole command (simulated / deployed) | results | load average (before, after) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in record["runs"]:
        lines.append(f"| {r['study']} | {r['supernodes']} | {r['simulated_wall_seconds']:.1f} s | "
                     f"{r['deployed_wall_seconds']:.1f} s | {r['ratio']:.1f}x | "
                     f"{r['simulated_command_seconds']:.0f} s / {r['deployed_command_seconds']:.0f} s | "
                     f"{_verdict(r['equal'], r['differences'])} | "
                     f"{_load_avg(r['load_average_before'])}, {_load_avg(r['load_average_after'])} |")
    lines += ["", f"Measured {record['date'][:10]} by `{record['benchmark']}` on {record['cores']} cores "
                  f"(flwr {record['flwr']}, torch {record['torch']}); kept in `{LOCAL}`."]
    return "\n".join(lines)


def _mins(s: float | None) -> str:
    if s is None:
        return "not run"
    return f"{int(s // 60)} min {s % 60:.0f} s" if s >= 60 else f"{s:.1f} s"


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def docker_table(record: dict[str, Any]) -> str:
    """Steps, runs and image sizes of one scripts/docker_federation.sh record."""
    s = record["seconds"]
    before = set(record.get("images_present_before") or [])

    def fresh(tag: str) -> str:  # no image of that tag and an empty BuildKit cache before the build
        cache = (record.get("build_cache_before") or "0B").strip()
        return "from scratch" if tag not in before and cache in ("0B", "0") else "cache present"

    rows = [("base image `ppfl/base:bookworm` (debootstrap minbase + python3-venv, `docker import`)", _mins(s["base_image"])),
            ("wheelhouse (`docker/make_wheelhouse.sh`)", "reused" if s.get("wheelhouse_reused") else _mins(s["wheelhouse"]))]
    order = ["ppfl/superlink:latest", "ppfl/supernode:latest", "ppfl/superexec:latest"]  # the script's build order
    for tag in sorted(s["images"], key=lambda t: order.index(t) if t in order else len(order)):
        shares = " after `ppfl/supernode`, whose dependency layer it shares" if tag == "ppfl/superexec:latest" else ""
        rows.append((f"`{tag.split(':')[0]}` ({fresh(tag)}{shares})", _mins(s["images"][tag])))
    rows += [("`deploy.export` of both studies (3 sites)", _mins(s["export"])),
             ("`compose up` until the 3 SuperNodes are online", _mins(s["compose_up"]))]
    for r in record["runs"]:
        verdict = _verdict(r.get("result") == "EQUAL", r.get("diffs", []))
        rows.append((f"{r['study']}: deployed / simulated", f"{_mins(r['deployed_s'])} / {_mins(r['simulated_s'])}, {verdict}"))
    rows.append(("the whole script", _mins(s["whole_script"])))
    lines = ["| step | wall time |", "| --- | --- |"] + [f"| {a} | {b} |" for a, b in rows]
    lines += ["", "| image | size (`docker image inspect`) |", "| --- | --- |"]
    lines += [f"| `{tag}` | {_gb(n)} |" for tag, n in sorted(record["image_bytes"].items(), key=lambda kv: kv[1])]
    lines += ["", f"Measured {record['date'][:10]} by `{record['script']}` on {record['cores']} cores, Docker "
                  f"{record['engine']} ({record['storage_driver']}), {record['compose']}; load average "
                  f"{_load_avg(record['load_average_start'])} at the start, {_load_avg(record['load_average_end'])} at "
                  f"the end; kept in `{DOCKER}`."]
    return "\n".join(lines)


BLOCKS = {
    "deploy-local-timings": lambda root: local_table(_load(root, LOCAL)),
    "deploy-docker-timings": lambda root: docker_table(_load(root, DOCKER)),
}
