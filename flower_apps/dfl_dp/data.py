"""The dfl-dp data plan: test set, four-way split and Dirichlet client partition.

Built identically (and cached per process) by the ServerApp and every ClientApp from the
config alone, so messages never carry data or indices.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import torch

from datasets.partition import class_counts, dirichlet_partition
from datasets.registry import load_dataset
from datasets.splits import four_way_split, train_and_test
from datasets.transforms import normalize_images

log = logging.getLogger(__name__)
TEST_HOLDOUT_SEED = 0  # the held-out test set (when the source has none) is the same for every seed


@dataclass(frozen=True)
class DataKey:
    """The config fields the data plan depends on."""

    dataset: str
    data_dir: str
    data_fraction: float
    test_fraction: float
    seed: int
    num_clients: int
    dirichlet_alpha: float
    data_part: str = "target"  # "target": clients hold target-train; "shadow": shadow-train (MIA shadow runs)


@dataclass
class DataPlan:
    """Normalized tensors for every part, and each client's indices into target-train."""

    name: str
    notes: list[str]
    num_classes: int
    image_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    x: dict[str, torch.Tensor]  # 'test', 'target_train', 'target_holdout', 'shadow_train', 'shadow_holdout'
    y: dict[str, torch.Tensor]
    client_indices: list[np.ndarray]  # indices into x[train_part]
    train_part: str = "target_train"

    def client_data(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.client_indices[cid])
        return self.x[self.train_part][idx], self.y[self.train_part][idx]

    def class_counts(self) -> np.ndarray:
        return class_counts(self.y[self.train_part].numpy(), self.client_indices, self.num_classes)


@functools.lru_cache(maxsize=4)
def build_data_plan(key: DataKey) -> DataPlan:
    """Load, hold out a test set if needed, subsample, split four ways, partition. Cached."""
    ds = load_dataset(key.dataset, key.data_dir or None)
    x_all, y_all, x_test, y_test, done = train_and_test(ds.x_train, ds.y_train, ds.x_test, ds.y_test,
                                                        key.test_fraction, key.data_fraction, key.seed,
                                                        TEST_HOLDOUT_SEED, " before the four-way split")
    notes = list(ds.notes) + done
    parts = four_way_split(y_all, key.seed)
    if key.data_part not in ("target", "shadow"):
        raise ValueError(f"data_part must be 'target' or 'shadow', got {key.data_part!r}")
    train_part = f"{key.data_part}_train"
    tt = parts[train_part]
    if key.num_clients > len(tt):
        raise ValueError(f"num-clients ({key.num_clients}) is larger than the {train_part} samples ({len(tt)})")
    # The shadow data is partitioned the same way (same N, alpha) with its own generator stream.
    clients = dirichlet_partition(y_all[tt], key.num_clients,
                                  np.random.default_rng([key.seed, 3] if key.data_part == "target" else [key.seed, 5]),
                                  alpha=key.dirichlet_alpha, min_size=1)
    xs = {"test": normalize_images(x_test, ds.mean, ds.std)}
    ys = {"test": torch.from_numpy(np.asarray(y_test, dtype=np.int64))}
    for name, idx in parts.items():
        xs[name] = normalize_images(x_all[idx], ds.mean, ds.std)
        ys[name] = torch.from_numpy(y_all[idx].astype(np.int64))
    if ds.reduced:
        log.warning("REDUCED DATASET %s: %s", ds.name, "; ".join(notes))
    return DataPlan(ds.name, notes, ds.num_classes, ds.image_shape, ds.mean, ds.std, xs, ys, clients, train_part)


def data_key(cfg) -> DataKey:  # cfg: DflDpConfig (duck-typed to keep this module config-agnostic)
    """The DataKey of a dfl-dp config."""
    return DataKey(cfg.dataset, cfg.data_dir, cfg.data_fraction, cfg.test_fraction, cfg.seed, cfg.num_clients,
                   cfg.dirichlet_alpha, cfg.data_part)


def validate_data(cfg) -> DataPlan:  # cfg: DflDpConfig
    """Build the run's data plan on the server before any work, so unusable data fails in seconds.

    Raises :class:`datasets.base.DataError` (one line naming the path) before the ServerApp
    creates its run folder or sends a message. The plan is cached, so the ServerApp's own
    ``build_data_plan`` call right after is free.
    """
    return build_data_plan(data_key(cfg))
