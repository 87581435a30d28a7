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
from datasets.splits import train_and_test
from datasets.transforms import normalize_images

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


@functools.lru_cache(maxsize=4)
def build_data_plan(key: DataKey) -> DataPlan:
    """Load, hold out a test set if the source has none, subsample, partition. Cached."""
    ds = load_dataset(key.dataset, key.data_dir or None)
    x, y, x_test, y_test, done = train_and_test(ds.x_train, ds.y_train, ds.x_test, ds.y_test, key.test_fraction,
                                                key.data_fraction, key.seed, TEST_HOLDOUT_SEED)
    notes = list(ds.notes) + done
    if key.num_nodes > len(y):
        raise ValueError(f"num-clients ({key.num_nodes}) is larger than the training samples ({len(y)})")
    parts = dirichlet_partition(y, key.num_nodes, np.random.default_rng([key.seed, 3]), alpha=key.alpha, min_size=1)
    # A fixed class-mixed order of the test set, so that a prefix is a fair evaluation subset.
    order = np.random.default_rng([TEST_HOLDOUT_SEED, 5]).permutation(len(y_test))
    if ds.reduced:
        log.warning("REDUCED DATASET %s: %s", ds.name, "; ".join(notes))
    return DataPlan(ds.name, notes, ds.num_classes, ds.image_shape, normalize_images(x, ds.mean, ds.std),
                    torch.from_numpy(y.astype(np.int64)), normalize_images(x_test[order], ds.mean, ds.std),
                    torch.from_numpy(y_test[order].astype(np.int64)), parts)


def data_key(cfg) -> DataKey:  # cfg: UdflConfig (duck-typed)
    return DataKey(cfg.dataset, cfg.data_dir, cfg.data_fraction, cfg.test_fraction, cfg.seed, cfg.num_nodes,
                   cfg.alpha)


def validate_data(cfg) -> DataPlan:  # cfg: UdflConfig
    """Build the run's data plan on the server before any work, so unusable data fails in seconds.

    Raises :class:`datasets.base.DataError` (one line naming the path) before the ServerApp
    creates its run folder or sends a message. The plan is cached, so the ServerApp's own
    ``build_data_plan`` call right after is free.
    """
    return build_data_plan(data_key(cfg))
