"""Wall time of a deployed run (loopback SuperLink + SuperNodes, TLS, SuperNode auth) against its simulation.

    python benchmarks/deploy_vs_simulation.py                           # both studies, prints the table
    python benchmarks/deploy_vs_simulation.py --keep results_deploy/local_federation.json

Per study, the same run keys twice: deployed through ``deploy.local_federation`` (``flwr run`` on a
SuperLink with ``--supernodes`` SuperNodes, simulated partitions: each SuperNode carves its part out of
the dataset by ``partition-id``; a new ``flwr-clientapp`` process per message; one intra-op thread per
SuperNode) and simulated in process (``flower_apps.runner.run_config_in_process``, one CPU per ClientApp
actor), both with the server's DP noise drawn from one seed file so that their results can be compared. Records each run's
``wall_seconds`` (summary.json: ServerApp start to end), the whole command's wall time (SuperLink and
SuperNodes start-up and teardown included), their ratio, whether the two runs' results are equal
(``deploy.docker_federation.compare_runs``), the machine's cores and load average. docs/deployment.md's
"deployed vs simulated" table is generated from the kept JSON (``flower_apps.common.deploy_docs``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

#: study -> (SuperNodes, run keys): dfl-dp's smoke preset (10 clients, 5 per message = 2 messages for 2
#: nodes), and tabular-pdp's smallest complete run (3 clients, one PDP round), as scripts/docker_federation.sh.
CASES: dict[str, tuple[int, dict[str, Any]]] = {
    "dfl-dp": (2, {"study": "dfl-dp", "preset": "smoke"}),
    "tabular-pdp": (3, {"study": "tabular-pdp", "preset": "smoke", "num-clients": 3, "num-rounds": 1,
                        "tab-settings": "pdp", "tab-levels": "2,1,0,0", "local-epochs": 1,
                        "tab-drift-exclude": False, "tab-clip-mode": "fixed"}),
}


def load_average() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def _summary(root: Path) -> tuple[Path, dict[str, Any]]:
    found = sorted(root.rglob("summary.json"))
    if len(found) != 1:
        raise RuntimeError(f"expected one finished run under {root}, found {len(found)}")
    return found[0].parent, json.loads(found[0].read_text())


def measure_study(study: str, workdir: Path, timeout: float = 1800) -> dict[str, Any]:
    """One deployed and one simulated run of ``study``'s case; the measured record."""
    from deploy.docker_federation import compare_runs
    from deploy.local_federation import LocalFederation
    from flower_apps.runner import run_config_in_process

    nodes, keys = CASES[study]
    # The same DP noise in both runs: the server draws it from one seed file (research only: whoever holds
    # the file can reproduce the noise), as scripts/docker_federation.sh does; without it each run draws
    # fresh noise and the results cannot be compared.
    seed_file = workdir / "noise.seed"
    seed_file.parent.mkdir(parents=True, exist_ok=True)
    seed_file.write_text("deploy vs simulation benchmark\n")
    keys = {**keys, "noise-seed-file": str(seed_file)}
    dep_root, sim_root = workdir / study / "deployed", workdir / study / "simulated"
    load_before = load_average()
    t0 = time.perf_counter()
    # one intra-op thread per SuperNode, as the simulation's actors have (num_cpus = 1): the same float order
    with LocalFederation(workdir / study / "federation", num_supernodes=nodes,
                         node_env=lambda i, w: {"OMP_NUM_THREADS": "1"}) as fed:
        run_id = fed.run({**keys, "results-dir": str(dep_root)})
        info = fed.wait(run_id, timeout, done=lambda: any(dep_root.rglob("summary.json")))
        if info["status"] != "finished:completed":
            raise RuntimeError(f"{study}: deployed run {run_id} {info['status']}\n{fed.report(run_id)}")
    deployed_cmd = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_config_in_process({**keys, "results-dir": str(sim_root)}, num_supernodes=nodes)
    simulated_cmd = time.perf_counter() - t0
    dep_dir, dep = _summary(dep_root)
    sim_dir, sim = _summary(sim_root)
    diffs = compare_runs(study, dep_dir, sim_dir)
    return {"study": study, "supernodes": nodes, "run_keys": keys,
            "deployed_wall_seconds": dep.get("wall_seconds"), "simulated_wall_seconds": sim.get("wall_seconds"),
            "ratio": (dep["wall_seconds"] / sim["wall_seconds"]) if dep.get("wall_seconds") and sim.get("wall_seconds")
            else None,
            "deployed_command_seconds": round(deployed_cmd, 1), "simulated_command_seconds": round(simulated_cmd, 1),
            "equal": not diffs, "differences": diffs, "load_average_before": load_before,
            "load_average_after": load_average()}


def measure(studies: list[str], workdir: Path) -> dict[str, Any]:
    import flwr
    import torch

    return {"benchmark": "benchmarks/deploy_vs_simulation.py",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cores": os.cpu_count(),
            "flwr": flwr.__version__, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "runs": [measure_study(s, workdir) for s in studies]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--studies", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--workdir", help="default: a new temporary directory")
    p.add_argument("--keep", help="write the record (JSON) here, e.g. results_deploy/local_federation.json")
    args = p.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ppfl-deploy-bench-"))
    record = measure(args.studies, workdir)
    from flower_apps.common.deploy_docs import local_table

    print(local_table(record))
    if args.keep:
        from flower_apps.common.results import atomic_write_json

        atomic_write_json(args.keep, record)
        print(f"record -> {args.keep}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
