"""Client-side data of the tabular-pdp study: one client per Country_Region, anonymized, split 80/20.

Each ClientApp rebuilds its data from the config alone (messages never carry data); results
are cached per process. The order of the steps follows the paper: anonymize the client's
whole table (k-anonymity, then the harmonized levels), then split it into train and test.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from datasets.cancer import (
    AGE_RANGE,
    CANCER_STAGES,
    CANCER_TYPES,
    COST_RANGE,
    GENDERS,
    GENERATOR_SEED,
    TARGET,
    YEAR_RANGE,
    load_cancer,
)
from datasets.node_local import NodeDataError, node_folder, read_manifest, read_table_clients
from privacy.anonymization import QUASI_IDENTIFIERS, SUPPRESSED, LevelSearch, apply_levels, search_levels
from registry import streams

_INTERVAL = re.compile(r"^\[(-?\d+), (-?\d+)\)$")


@dataclass(frozen=True)
class DataKey:
    """The config fields a client's table depends on."""

    dataset: str
    data_dir: str
    data_fraction: float
    node_path: str = ""  # deployment: the node's data-path (its CSV is the client's whole table)
    node: str = ""  # the node's name, for error messages


def data_key(cfg) -> DataKey:  # cfg: TabularPdpConfig (duck-typed)
    return DataKey(cfg.dataset, cfg.data_dir, cfg.data_fraction)


@functools.lru_cache(maxsize=2)
def _table(dataset: str, data_dir: str) -> tuple[pd.DataFrame, tuple[str, ...]]:
    df, notes = load_cancer(dataset, data_dir)
    return df, tuple(notes)


def regions(key: DataKey) -> list[str]:
    """Client id -> Country_Region: the table's regions in sorted order."""
    df, _ = _table(key.dataset, key.data_dir)
    return sorted(df["Country_Region"].unique())


@functools.lru_cache(maxsize=32)
def client_table(key: DataKey, cid: int) -> pd.DataFrame:
    """Rows of client ``cid``'s region (a fixed-seed subsample when data-fraction < 1).

    With node-local data: the node's CSV for ``cid``, as it is (the export already subsampled it).
    """
    if key.node_path:
        tables = node_tables(key.node_path, key.node)
        if cid not in tables:
            raise NodeDataError(f"{key.node}: holds clients {sorted(tables)}, asked for client {cid}")
        return tables[cid]
    names = regions(key)
    if not 0 <= cid < len(names):
        raise ValueError(f"client {cid} has no Country_Region: the table has {len(names)} ({', '.join(names)})")
    df, _ = _table(key.dataset, key.data_dir)
    rows = df[df["Country_Region"] == names[cid]].reset_index(drop=True)
    if key.data_fraction < 1:
        rng = streams.rng("tabular-pdp.client-table", GENERATOR_SEED, cid)
        keep = np.sort(rng.choice(len(rows), max(1, int(round(len(rows) * key.data_fraction))), replace=False))
        rows = rows.iloc[keep].reset_index(drop=True)
    return rows


@functools.lru_cache(maxsize=2)
def node_tables(node_path: str, node: str) -> dict[int, pd.DataFrame]:
    """The node's validated tables from ``<data-path>[/tabular-pdp]/node.json`` (cancer-csv)."""
    m = read_manifest(node_folder(node_path, "tabular-pdp"), "cancer-csv", node)
    return read_table_clients(m)


def region_of(key: DataKey, cid: int) -> str:
    """Client ``cid``'s Country_Region (from the node's own table in a deployment)."""
    if key.node_path:
        return str(client_table(key, cid)["Country_Region"].iloc[0])
    names = regions(key)
    return names[cid] if cid < len(names) else ""


@functools.lru_cache(maxsize=32)
def client_search(key: DataKey, cid: int, k: int, suppression: float) -> LevelSearch:
    """The client's own k-anonymity levels (anjana); raises AnonymizationError when unreachable."""
    return search_levels(client_table(key, cid), k, suppression)


@functools.lru_cache(maxsize=32)
def anonymized_table(key: DataKey, cid: int, levels: tuple[int, ...], k: int) -> tuple[pd.DataFrame, int]:
    """(table generalized with the harmonized levels and k-suppressed, number of suppressed records)."""
    return apply_levels(client_table(key, cid), levels, k)


def _age_value(v) -> float:
    if isinstance(v, (int, np.integer, float, np.floating)):
        return float(v)
    m = _INTERVAL.match(str(v))
    if not m:
        raise ValueError(f"Age value {v!r} is neither a number nor an interval '[lo, hi)'")
    lo, hi = int(m.group(1)), int(m.group(2))
    return (lo + hi - 1) / 2.0  # mean of the integer ages in [lo, hi)


def model_features(features: tuple[str, ...], levels: tuple[int, ...]) -> tuple[str, ...]:
    """The features the model sees: a QI generalized to "*" only (Gender at level 1) carries nothing."""
    suppressed = {q for q, lv in zip(QUASI_IDENTIFIERS, levels) if q == "Gender" and lv >= 1}
    return tuple(f for f in features if f not in suppressed)


def encode(df: pd.DataFrame, features: tuple[str, ...]) -> np.ndarray:
    """Fixed, schema-based scaling to about [0, 1] (identical on every client, no data statistics)."""
    cols = []
    for f in features:
        s = df[f]
        if f == "Age":
            x = (s.map(_age_value).to_numpy(float) - AGE_RANGE[0]) / (AGE_RANGE[1] - AGE_RANGE[0])
        elif f == "Gender":
            if (s == SUPPRESSED).any():
                raise ValueError("Gender is suppressed ('*') and cannot be a model feature")
            x = s.map({g: i for i, g in enumerate(GENDERS)}).to_numpy(float) / (len(GENDERS) - 1)
        elif f == "Year":
            x = (s.to_numpy(float) - YEAR_RANGE[0]) / (YEAR_RANGE[1] - YEAR_RANGE[0])
        elif f == "Cancer_Type":
            x = s.map({t: i for i, t in enumerate(CANCER_TYPES)}).to_numpy(float) / (len(CANCER_TYPES) - 1)
        elif f == "Cancer_Stage":
            x = s.map({t: i for i, t in enumerate(CANCER_STAGES)}).to_numpy(float) / (len(CANCER_STAGES) - 1)
        elif f == "Treatment_Cost_USD":
            x = (s.to_numpy(float) - COST_RANGE[0]) / (COST_RANGE[1] - COST_RANGE[0])
        else:  # risk factors and Survival_Years lie in [0, 10]
            x = s.to_numpy(float) / 10.0
        cols.append(x)
    return np.stack(cols, axis=1).astype(np.float32)


@dataclass(frozen=True)
class ClientData:
    """One client's tensors after anonymization, split and (optional) poisoning."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    suppressed: int


def poison_train(x: np.ndarray, y: np.ndarray, kind: str, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """A drifted/poisoned client's training data: shifted or flipped targets, or scaled features."""
    if kind == "none":
        return x, y
    if kind == "shift-targets":
        return x, y + scale * float(np.std(y))
    if kind == "flip-targets":
        return x, (float(y.max()) + float(y.min())) - y
    if kind == "scale-features":
        return x * scale, y
    raise ValueError(f"unknown poison {kind!r}")


@functools.lru_cache(maxsize=64)
def client_data(key: DataKey, cid: int, levels: tuple[int, ...], k: int, features: tuple[str, ...],
                test_fraction: float, seed: int, poison: str = "none", poison_scale: float = 1.0) -> ClientData:
    """Anonymize with ``levels``, split train/test with ``seed``, encode, poison the train part if asked."""
    table, suppressed = anonymized_table(key, cid, levels, k)
    n = len(table)
    if n < 2:
        raise ValueError(f"client {cid}: {n} record(s) left after anonymization; cannot split train/test")
    rng = streams.rng("tabular-pdp.client-split", seed, cid)
    perm = rng.permutation(n)
    n_test = min(n - 1, max(1, int(round(n * test_fraction))))
    test, train = perm[:n_test], perm[n_test:]
    feats = model_features(features, levels)
    x, y = encode(table, feats), table[TARGET].to_numpy(np.float32)
    x_tr, y_tr = poison_train(x[train], y[train], poison, poison_scale)
    return ClientData(torch.from_numpy(np.ascontiguousarray(x_tr, np.float32)),
                      torch.from_numpy(np.ascontiguousarray(y_tr, np.float32)),
                      torch.from_numpy(x[test]), torch.from_numpy(y[test]), suppressed)


def validate_data(cfg) -> None:  # cfg: TabularPdpConfig
    """Read and schema-check the run's table on the server, before any message goes to a client.

    Without it only the clients read the CSV, and a wrong column type surfaces as one
    traceback per client under a misleading "k-anonymity failed" headline. Raises
    :class:`datasets.cancer.CancerSchemaError` (a DataError; one line naming the file and
    the column) or :class:`datasets.base.DatasetUnavailableError` (the path). The table is
    cached, so clients simulated in this process do not read it again.
    """
    _table(cfg.dataset, cfg.data_dir)
