"""One study on the Docker federation (docker/compose.yaml), then its simulation, then the comparison.

scripts/docker_federation.sh brings the containers up and calls this once per study; it runs on
the host, in the project's environment:

1. the deployed run: ``flwr run . <connection>`` (the host's flwr CLI, a private FLWR_HOME) with the
   run config ``deploy.export`` recorded for the study, its paths rewritten to where the
   containers mount them (the coordinator's folder at /coordinator in the ``serverapp`` service),
   DP noise from the server's ``noise-seed-file`` and results written by the ServerApp under
   /app/results (the host's ``results/``);
2. the in-process simulation of the same keys (same seed, seed file, clients-per-message), one CPU
   per client as the SuperNodes' ``OMP_NUM_THREADS=1``;
3. the comparison tests/deploy/test_node_local_federation.py makes on loopback: dfl-dp's final model
   (rtol 1e-5, atol 1e-6) and accuracy curve, tabular-pdp's per-round errors and final MAE.

    python -m deploy.docker_federation --study dfl-dp --data docker/data --flwr-home /tmp/h \\
        --connection compose --results results/docker-federation --seed-file docker/data/coordinator/noise.seed \\
        --extra "clients-per-message=2"
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from deploy import flwr_cli

REPO = Path(__file__).resolve().parents[1]
STUDIES = ("dfl-dp", "tabular-pdp")  # the studies whose results compare_runs knows how to compare
CONTAINER_COORDINATOR = "/coordinator"  # docker/compose.yaml: ./data/coordinator -> /coordinator (serverapp)
CONTAINER_WORKDIR = "/app"  # the ServerApp's working directory; /app/results is the host's results/


def container_path(host_path: str | Path, data_root: str | Path) -> str:
    """``<data_root>/coordinator/x`` on the host -> ``/coordinator/x`` in the serverapp container."""
    rel = Path(host_path).resolve().relative_to((Path(data_root) / "coordinator").resolve())
    return f"{CONTAINER_COORDINATOR}/{rel.as_posix()}"


def deployed_config(study: str, data_root: str | Path, seed_file: str | Path, results_rel: str,
                    extra: dict[str, Any]) -> dict[str, Any]:
    """The deployed run's config: export.json's run config in container paths, seed file, results-dir."""
    record = json.loads((Path(data_root) / "export.json").read_text())
    if study not in record:
        raise ValueError(f"{data_root}/export.json has no {study!r} export; run python -m deploy.export first")
    cfg = dict(record[study]["run_config"])
    if "eval-data-path" in cfg:
        cfg["eval-data-path"] = container_path(cfg["eval-data-path"], data_root)
    return {**cfg, **extra, "noise-seed-file": container_path(seed_file, data_root), "results-dir": results_rel}


def simulated_config(study: str, data_root: str | Path, seed_file: str | Path, results_dir: str | Path,
                     extra: dict[str, Any]) -> dict[str, Any]:
    """The same run as a simulation: the study's own partition (no node-local data), the host's seed file."""
    record = json.loads((Path(data_root) / "export.json").read_text())[study]
    cfg = {k: v for k, v in record["run_config"].items() if k not in ("node-local-data", "eval-data-path")}
    return {**cfg, **extra, "noise-seed-file": str(Path(seed_file).resolve()), "results-dir": str(results_dir)}


def _one_run_dir(root: Path) -> Path:
    found = sorted(root.rglob("summary.json"))
    if len(found) != 1:
        raise RuntimeError(f"expected one finished run (summary.json) under {root}, found {len(found)}")
    return found[0].parent


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(r) for r in (run_dir / "rounds.jsonl").read_text().splitlines() if r.strip()]


def _near(a: float, b: float, rel: float, abs_: float) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def compare_runs(study: str, deployed: Path, simulated: Path) -> list[str]:
    """Differences between a deployed and a simulated run folder ([] = equal to the tolerances of
    tests/deploy/test_node_local_federation.py)."""
    if study not in STUDIES:
        raise ValueError(f"no comparison for study {study!r}; available: {list(STUDIES)}")
    a, b = json.loads((deployed / "summary.json").read_text()), json.loads((simulated / "summary.json").read_text())
    diffs: list[str] = []
    if study == "dfl-dp":
        import torch

        ma = torch.load(deployed / "final_model.pt", weights_only=True)
        mb = torch.load(simulated / "final_model.pt", weights_only=True)
        if ma.keys() != mb.keys():
            return [f"final_model.pt keys differ: {sorted(set(ma) ^ set(mb))}"]
        for k in ma:
            if not torch.allclose(ma[k].double(), mb[k].double(), rtol=1e-5, atol=1e-6):
                diffs.append(f"final_model.pt[{k}]: max |diff| {float((ma[k].double() - mb[k].double()).abs().max()):.3g}")
        if len(a["acc_curve"]) != len(b["acc_curve"]) or not all(
                _near(x, y, 0.0, 1e-9) for x, y in zip(a["acc_curve"], b["acc_curve"])):
            diffs.append(f"acc_curve {a['acc_curve']} != {b['acc_curve']}")
        ca, cb = (deployed / "class_counts.csv").read_text(), (simulated / "class_counts.csv").read_text()
        if ca != cb:
            diffs.append("class_counts.csv differs")
    else:  # tabular-pdp
        for key in ("participants", "regions", "train_sizes"):
            if a.get(key) != b.get(key):
                diffs.append(f"{key}: {a.get(key)} != {b.get(key)}")
        ra, rb = _rows(deployed), _rows(simulated)
        if len(ra) != len(rb) or not rb:
            diffs.append(f"rounds.jsonl: {len(ra)} rows deployed, {len(rb)} simulated")
        for i, (x, y) in enumerate(zip(ra, rb)):
            for k, v in y.items():
                if isinstance(v, float) and k not in ("seconds", "elapsed_s") and not (
                        isinstance(x.get(k), float) and _near(x[k], v, 1e-5, 1e-7)):
                    diffs.append(f"rounds.jsonl row {i} {k}: {x.get(k)} != {v}")
        for s, m in b["settings"].items():
            got = a["settings"].get(s, {}).get("final_mae")
            if got is None or not _near(got, m["final_mae"], 1e-5, 0.0):
                diffs.append(f"settings[{s}].final_mae: {got} != {m['final_mae']}")
    return diffs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.docker_federation", description=__doc__.split("\n")[0])
    p.add_argument("--study", required=True, choices=STUDIES)
    p.add_argument("--data", required=True, help="the deploy.export folder the compose file mounts (docker/data)")
    p.add_argument("--flwr-home", required=True, help="FLWR_HOME holding the connection (never ~/.flwr)")
    p.add_argument("--connection", default="compose")
    p.add_argument("--results", required=True,
                   help="folder under the repository's results/ (mounted at /app/results) for the deployed run")
    p.add_argument("--sim-results", required=True, help="folder for the simulated run")
    p.add_argument("--seed-file", required=True, help="the server's noise seed file, under <data>/coordinator")
    p.add_argument("--extra", default="", help="run keys for both runs, e.g. \"clients-per-message=2\"")
    p.add_argument("--nodes", type=int, default=3, help="SuperNodes of the simulation (the compose file's 3)")
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args(argv)
    from strategies.flwr_adapter import parse_run_config

    extra = dict(parse_run_config([args.extra])) if args.extra else {}
    results = Path(args.results).resolve()
    try:
        results_rel = results.relative_to(REPO).as_posix()  # /app is the repository root's stand-in
    except ValueError:
        p.error(f"--results must lie under {REPO}/results (the serverapp service mounts ../results), got {results}")
    if not results_rel.startswith("results/"):
        p.error(f"--results must lie under {REPO}/results, got {results}")
    if any(results.rglob("summary.json")) or any(Path(args.sim_results).rglob("summary.json")):
        p.error(f"{results} or {args.sim_results} already holds a run: give new folders")
    dep_cfg = deployed_config(args.study, args.data, args.seed_file, results_rel, extra)
    sim_cfg = simulated_config(args.study, args.data, args.seed_file, Path(args.sim_results).resolve(), extra)

    t0 = time.monotonic()
    run_id = flwr_cli.start_run(REPO, args.connection, args.flwr_home, dep_cfg)  # `flwr run . compose ...`
    print(f"[{args.study}] deployed run {run_id} started (flwr run . {args.connection})", flush=True)
    info = flwr_cli.wait_run(run_id, args.connection, args.flwr_home, args.timeout,
                             done=lambda: any(results.rglob("summary.json")))
    deployed_s = time.monotonic() - t0
    if info["status"] != "finished:completed":
        print(flwr_cli.run_log(run_id, args.connection, args.flwr_home))
        print(f"[{args.study}] deployed run {run_id}: {info['status']} {info.get('status-details', '')}")
        return 1
    print(f"[{args.study}] deployed run {run_id} finished in {deployed_s:.1f} s", flush=True)

    from flower_apps.runner import run_config_in_process

    t0 = time.monotonic()
    run_config_in_process(sim_cfg, num_supernodes=args.nodes)
    simulated_s = time.monotonic() - t0
    print(f"[{args.study}] simulation finished in {simulated_s:.1f} s", flush=True)

    diffs = compare_runs(args.study, _one_run_dir(results), _one_run_dir(Path(args.sim_results)))
    verdict = "EQUAL" if not diffs else "DIFFERENT"
    print(json.dumps({"study": args.study, "run_id": run_id, "deployed_s": round(deployed_s, 1),
                      "simulated_s": round(simulated_s, 1), "result": verdict, "diffs": diffs}))
    for d in diffs:
        print(f"  {d}")
    return 0 if not diffs else 2


if __name__ == "__main__":
    raise SystemExit(main())
