"""Write per-node data folders exactly as the simulation partitions a dataset (same seed, same partition).

    python -m deploy.export --study dfl-dp --nodes 2 --seed 0 --preset smoke --out DIR
    python -m deploy.export --study tabular-pdp --nodes 2 --seed 0 --preset smoke --out DIR
    python -m deploy.export --study unlinkable-dfl --nodes 2 --seed 0 --preset smoke --out DIR
    python -m deploy.export --study ultrasound --nodes 2 --seed 0 --preset smoke --out DIR

A site can rehearse a deployment with it, and a simulated and a deployed run of the same config
can be compared model for model (tests/deploy/test_node_local_federation.py). Layout::

    DIR/node-<i>/<study>/node.json + the node's client files   -> SuperNode i: data-path=DIR/node-<i>
    DIR/coordinator/<study>/eval.npz                            -> the ServerApp's eval-data-path
    DIR/coordinator/ultrasound/{test,val}/                      -> (ultrasound: BUSI-layout folders)
    DIR/export.json                                             -> what was exported, and the run config

The logical clients are dealt to the nodes in contiguous blocks of whole messages
(``clients-per-message``), so that each message the strategies build addresses one node.
It lives in ``deploy/`` (not ``datasets/``) because it reuses each study's partition code in
``flower_apps``, which the shared packages must not import.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from datasets.node_local import (
    EVAL_FILE,
    write_atomic,
    write_busi_folder,
    write_image_node,
    write_manifest,
    write_npz,
    write_table_node,
)


def node_blocks(num_clients: int, nodes: int, clients_per_message: int = 1) -> list[list[int]]:
    """Logical clients 0..N-1 dealt to ``nodes`` nodes in contiguous blocks of whole messages."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    chunks = [list(range(i, min(i + clients_per_message, num_clients)))
              for i in range(0, num_clients, clients_per_message)]
    if nodes > len(chunks):
        raise ValueError(f"{nodes} nodes but only {len(chunks)} messages of clients-per-message="
                         f"{clients_per_message} for {num_clients} clients: lower clients-per-message or the nodes")
    return [[c for j in part for c in chunks[j]] for part in np.array_split(np.arange(len(chunks)), nodes)]


def _export_dfl_dp(cfg, blocks: list[list[int]], out: Path) -> dict[str, Any]:
    from datasets.image_plan import raw_image_split
    from flower_apps.dfl_dp.data import data_key

    if cfg.framework != "fl" and cfg.clients_per_message != 1:
        raise ValueError("sequential-dfl with node-local data needs clients-per-message=1 (a chain hop may cross "
                         "nodes)")
    raw = raw_image_split(data_key(cfg))
    tt = raw.parts[raw.train_part]
    x_train, y_train = raw.x_all[tt], raw.y_all[tt]
    ds = raw.ds
    for i, block in enumerate(blocks):
        write_image_node(out / f"node-{i}" / "dfl-dp",
                         {c: (x_train[raw.clients[c]], y_train[raw.clients[c]]) for c in block},
                         ds.num_classes, ds.mean, ds.std, node=f"node-{i}")
    # typed in datasets/node_local.py: write_npz takes **ndarray; np.savez stores the int64 scalar as a 0-d array
    ev = write_npz(out / "coordinator" / "dfl-dp" / EVAL_FILE, x=np.asarray(raw.x_test),
                   y=np.asarray(raw.y_test, np.int64), num_classes=cast(np.ndarray, np.int64(ds.num_classes)),
                   mean=np.asarray(ds.mean, float), std=np.asarray(ds.std, float))
    return {"node-local-data": True, "eval-data-path": str(ev)}


def _export_unlinkable_dfl(cfg, blocks: list[list[int]], out: Path) -> dict[str, Any]:
    from flower_apps.unlinkable_dfl.data import data_key, raw_split

    r = raw_split(data_key(cfg))
    for i, block in enumerate(blocks):
        write_image_node(out / f"node-{i}" / "unlinkable-dfl",
                         {c: (r.x[r.node_indices[c]], r.y[r.node_indices[c]]) for c in block},
                         r.num_classes, r.mean, r.std, node=f"node-{i}")
    # The test set in the simulation's fixed order: the coordinator evaluates every node on its prefix.
    # typed in datasets/node_local.py: write_npz takes **ndarray (the int64 scalar is stored as a 0-d array)
    ev = write_npz(out / "coordinator" / "unlinkable-dfl" / EVAL_FILE, x=np.asarray(r.x_test),
                   y=np.asarray(r.y_test, np.int64), num_classes=cast(np.ndarray, np.int64(r.num_classes)),
                   mean=np.asarray(r.mean, float), std=np.asarray(r.std, float))
    return {"node-local-data": True, "eval-data-path": str(ev)}


def _export_ultrasound(cfg, blocks: list[list[int]], out: Path) -> dict[str, Any]:
    from flower_apps.ultrasound.data import export_layout

    if cfg.mode != "federated":
        raise ValueError(f"us-mode={cfg.mode!r}: node-local data serves federated runs only (centralized pools "
                         "every client's images on the server, local-only evaluates on the test set on each node)")
    lay = export_layout(cfg)
    for i, block in enumerate(blocks):
        root = out / f"node-{i}" / "ultrasound"
        for c in block:
            write_busi_folder(root / f"client-{c}", lay.images, lay.labels, lay.client_train[c], lay.class_names)
        write_manifest(root, "busi-folder", {c: f"client-{c}" for c in block}, node=f"node-{i}")
    coord = out / "coordinator" / "ultrasound"
    for part in ("test", "val"):
        write_busi_folder(coord / part, lay.images, lay.labels, lay.held_out[part], lay.class_names)
    return {"node-local-data": True, "eval-data-path": str(coord)}


def _export_tabular_pdp(cfg, blocks: list[list[int]], out: Path) -> dict[str, Any]:
    from flower_apps.tabular_pdp.data import client_table, data_key

    key = data_key(cfg)
    for i, block in enumerate(blocks):
        write_table_node(out / f"node-{i}" / "tabular-pdp", {c: client_table(key, c) for c in block},
                         node=f"node-{i}")
    return {"node-local-data": True}  # evaluation is federated: each client's held-out split


# study -> (exporter, whether several clients may share one message)
EXPORTERS: dict[str, tuple[Callable[[Any, list[list[int]], Path], dict[str, Any]], bool]] = {
    "dfl-dp": (_export_dfl_dp, True),
    "tabular-pdp": (_export_tabular_pdp, False),
    "unlinkable-dfl": (_export_unlinkable_dfl, False),  # its messages are grouped per node at run time
    "ultrasound": (_export_ultrasound, False),  # one client per message
}


def export(study: str, nodes: int, seed: int, out: str | Path, preset: str = "paper",
           overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the node folders of ``study`` for ``nodes`` nodes; returns what export.json records."""
    from flower_apps.router import prepare

    if study not in EXPORTERS:
        raise ValueError(f"no export for study {study!r} yet; available: {sorted(EXPORTERS)}")
    raw = {**(overrides or {}), "study": study, "preset": preset, "seed": seed}
    spec, cfg = prepare(raw)
    fn, packs = EXPORTERS[study]
    num_clients = getattr(cfg, "num_clients", None) or cfg.num_nodes  # unlinkable-dfl calls its clients nodes
    cpm = getattr(cfg, "clients_per_message", 1)
    if packs and "clients-per-message" not in (overrides or {}) and -(-num_clients // cpm) < nodes <= num_clients:
        # The preset packs more clients per message than the sites allow (each message goes to one node): the
        # largest packing that gives every node a message, recorded in the run config the coordinator repeats.
        # A clients-per-message the user gave is never changed (node_blocks refuses it with the reason).
        fit = next(c for c in range(-(-num_clients // nodes), 0, -1) if -(-num_clients // c) >= nodes)
        overrides = {**(overrides or {}), "clients-per-message": fit}
        spec, cfg = prepare({**raw, **overrides})
        print(f"export: clients-per-message={cfg.clients_per_message} (the {preset} preset's {cpm} would leave "
              f"{nodes} nodes only {-(-num_clients // cpm)} messages); the coordinator's flwr run below repeats it")
    blocks = node_blocks(num_clients, nodes, getattr(cfg, "clients_per_message", 1) if packs else 1)
    out = Path(out).resolve()
    run_config = fn(cfg, blocks, out)
    # an exporter sets only the keys of a deployment (role "deployment": node-local-data, eval-data-path)
    stray = sorted(set(run_config) - {k.name for k in spec.keys.with_role("deployment")})
    if stray:
        raise RuntimeError(f"the {study} exporter sets {stray}, which are not deployment keys of the study")
    record = {"study": study, "preset": preset, "seed": seed, "overrides": overrides or {},
              "nodes": {f"node-{i}": {"data-path": str(out / f"node-{i}"), "client_ids": b}
                        for i, b in enumerate(blocks)},
              "run_config": {"study": study, "preset": preset, "seed": seed, **(overrides or {}), **run_config}}
    path = out / "export.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    merged = {**old, study: record}  # one export.json for every study exported into DIR
    write_atomic(path, lambda fh: fh.write((json.dumps(merged, indent=1) + "\n").encode()))
    return record


def _toml(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else (f"'{v}'" if isinstance(v, str) else str(v))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.export", description=__doc__.split("\n")[0])
    p.add_argument("--study", required=True, choices=sorted(EXPORTERS))
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", default="paper")
    p.add_argument("--run-config", default="", help="further run keys, e.g. \"num-clients=20 dataset='mnist'\"")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.run_config:
        from strategies.flwr_adapter import parse_run_config

        overrides = dict(parse_run_config([args.run_config]))
    try:
        rec = export(args.study, args.nodes, args.seed, args.out, args.preset, overrides)
    except (ValueError, OSError) as exc:  # ConfigError and DataError are ValueErrors naming the problem
        print(f"export refused: {exc}")
        return 1
    for name, node in rec["nodes"].items():
        print(f"{name}: clients {node['client_ids']} -> flower-supernode ... --node-config "
              f"\"data-path='{node['data-path']}' node-name='{name}'\"")
    print("coordinator: flwr run . <federation> --run-config \""
          + " ".join(f"{k}={_toml(v)}" for k, v in rec["run_config"].items()) + "\"")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
