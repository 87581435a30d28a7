"""The unlinkable-dfl data plan: test set and Dirichlet(alpha) partition over the nodes.

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
from datasets.splits import stratified_holdout, subsample_stratified

log = logging.getLogger(__name__)
TEST_HOLDOUT_SEED = 0  # the held-out test set (when the source has none) is the same for every seed


@dataclass(frozen=True)
class DataKey:
    dataset: str
    data_dir: str
    data_fraction: float
    test_fraction: float
    seed: int
    num_nodes: int
    alpha: float


@dataclass
class DataPlan:
    """Normalized train/test tensors and each node's indices into the training set."""

    name: str
    notes: list[str]
    num_classes: int
    image_shape: tuple[int, int, int]
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    node_indices: list[np.ndarray]

    def node_data(self, node: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.node_indices[node])
        return self.x_train[idx], self.y_train[idx]

    def test_subset(self, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``samples`` test images (a fixed, class-mixed subset; 0 = all)."""
        if samples <= 0 or samples >= len(self.y_test):
            return self.x_test, self.y_test
        return self.x_test[:samples], self.y_test[:samples]

    def class_counts(self) -> np.ndarray:
        return class_counts(self.y_train.numpy(), self.node_indices, self.num_classes)


def _normalize(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    t = torch.from_numpy(x).float().div_(255.0)
    t = t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2)
    return ((t - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)).contiguous()


@functools.lru_cache(maxsize=4)
def build_data_plan(key: DataKey) -> DataPlan:
    """Load, hold out a test set if the source has none, subsample, partition. Cached."""
    ds = load_dataset(key.dataset, key.data_dir or None)
    notes = list(ds.notes)
    x, y = ds.x_train, np.asarray(ds.y_train)
    if ds.x_test is None:
        tr, te = stratified_holdout(y, key.test_fraction, TEST_HOLDOUT_SEED)
        x_test, y_test = x[te], y[te]
        x, y = x[tr], y[tr]
        notes.append(f"no separate test set: a stratified {key.test_fraction:.0%} ({len(te)} images) was held out")
    else:
        x_test, y_test = ds.x_test, np.asarray(ds.y_test)
    if key.data_fraction < 1:
        keep = subsample_stratified(y, key.data_fraction, key.seed)
        x, y = x[keep], y[keep]
        notes.append(f"data-fraction {key.data_fraction}: {len(keep)} training images used")
    if key.num_nodes > len(y):
        raise ValueError(f"num-clients ({key.num_nodes}) is larger than the training samples ({len(y)})")
    parts = dirichlet_partition(y, key.num_nodes, np.random.default_rng([key.seed, 3]), alpha=key.alpha, min_size=1)
    # A fixed class-mixed order of the test set, so that a prefix is a fair evaluation subset.
    order = np.random.default_rng([TEST_HOLDOUT_SEED, 5]).permutation(len(y_test))
    if ds.reduced:
        log.warning("REDUCED DATASET %s: %s", ds.name, "; ".join(notes))
    return DataPlan(ds.name, notes, ds.num_classes, ds.image_shape, _normalize(x, ds.mean, ds.std),
                    torch.from_numpy(y.astype(np.int64)), _normalize(x_test[order], ds.mean, ds.std),
                    torch.from_numpy(y_test[order].astype(np.int64)), parts)


def data_key(cfg) -> DataKey:  # cfg: UdflConfig (duck-typed)
    return DataKey(cfg.dataset, cfg.data_dir, cfg.data_fraction, cfg.test_fraction, cfg.seed, cfg.num_nodes,
                   cfg.alpha)
