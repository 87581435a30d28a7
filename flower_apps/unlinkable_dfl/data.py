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

from datasets.base import DataError
from datasets.partition import class_counts, dirichlet_partition
from datasets.registry import load_dataset
from datasets.splits import train_and_test
from datasets.transforms import normalize_images
from flower_apps.common.node_data import ImageNode, read_image_node
from flower_apps.common.node_data import image_shape as _image_shape
from registry import streams

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


@dataclass
class RawSplit:
    """The plan before normalization: uint8 train/test images, the test order, each node's indices."""

    name: str
    notes: list[str]
    num_classes: int
    image_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray  # in the fixed class-mixed order (a prefix is a fair evaluation subset)
    y_test: np.ndarray
    node_indices: list[np.ndarray]


@functools.lru_cache(maxsize=2)
def raw_split(key: DataKey) -> RawSplit:
    """Load, hold out a test set if the source has none, subsample, partition (what the export writes)."""
    ds = load_dataset(key.dataset, key.data_dir or None)
    x, y, x_test, y_test, done = train_and_test(ds.x_train, ds.y_train, ds.x_test, ds.y_test, key.test_fraction,
                                                key.data_fraction, key.seed, TEST_HOLDOUT_SEED)
    notes = list(ds.notes) + done
    if key.num_nodes > len(y):
        raise ValueError(f"num-clients ({key.num_nodes}) is larger than the training samples ({len(y)})")
    parts = dirichlet_partition(y, key.num_nodes, streams.rng("datasets.partition", key.seed), alpha=key.alpha, min_size=1)
    # A fixed class-mixed order of the test set, so that a prefix is a fair evaluation subset.
    order = streams.rng("unlinkable-dfl.eval-order", TEST_HOLDOUT_SEED).permutation(len(y_test))
    if ds.reduced:
        log.warning("REDUCED DATASET %s: %s", ds.name, "; ".join(notes))
    return RawSplit(ds.name, notes, ds.num_classes, ds.image_shape, tuple(ds.mean), tuple(ds.std), x, y,
                    x_test[order], y_test[order], parts)


@functools.lru_cache(maxsize=4)
def build_data_plan(key: DataKey) -> DataPlan:
    """Load, hold out a test set if the source has none, subsample, partition. Cached."""
    r = raw_split(key)
    return DataPlan(r.name, r.notes, r.num_classes, r.image_shape, normalize_images(r.x, r.mean, r.std),
                    torch.from_numpy(r.y.astype(np.int64)), normalize_images(r.x_test, r.mean, r.std),
                    torch.from_numpy(r.y_test.astype(np.int64)), r.node_indices)


def data_key(cfg) -> DataKey:  # cfg: UdflConfig (duck-typed)
    return DataKey(cfg.dataset, cfg.data_dir, cfg.data_fraction, cfg.test_fraction, cfg.seed, cfg.num_nodes,
                   cfg.alpha)


def validate_data(cfg) -> DataPlan | EvalSet:  # cfg: UdflConfig
    """Build the run's data plan on the server before any work, so unusable data fails in seconds.

    Raises :class:`datasets.base.DataError` (one line naming the path) before the ServerApp
    creates its run folder or sends a message. The plan is cached, so the ServerApp's own
    ``build_data_plan`` call right after is free. With node-local data the coordinator holds
    only its test set (:func:`eval_set`).
    """
    return eval_set(cfg) if cfg.node_local_data else build_data_plan(data_key(cfg))


# --- Deployment with node-local data (datasets.node_local): a SuperNode reads only its data-path.
# The learners' local training runs in the ClientApps (client_app._train_phase), so that is where
# node-local data is read; the ServerApp plays only the network and the nodes' memory, and evaluates
# the nodes' models on the coordinator's test set (eval-data-path), as the simulated nodes do on theirs.
@dataclass
class NodeShards(ImageNode):
    """The logical nodes one SuperNode holds: normalized images per node, with the attributes the ClientApp reads."""

    def node_data(self, node: int) -> tuple[torch.Tensor, torch.Tensor]:
        if node not in self.x:
            raise DataError(f"{self.node}: holds nodes {sorted(self.x)}, asked for node {node}")
        return self.x[node], self.y[node]


@functools.lru_cache(maxsize=2)
def node_shards(data_path: str, node: str) -> NodeShards:
    """The node's shards from ``<data-path>[/unlinkable-dfl]/node.json`` (images-npz); NodeDataError if unusable."""
    return NodeShards(**vars(read_image_node(data_path, "unlinkable-dfl", node)[0]))


@dataclass
class EvalSet:
    """The coordinator's side of a node-local deployment: its test set (normalized, in the export's order)."""

    name: str
    notes: list[str]
    num_classes: int
    image_shape: tuple[int, int, int]
    x_test: torch.Tensor
    y_test: torch.Tensor

    def test_subset(self, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``samples`` test images (0 = all), as :meth:`DataPlan.test_subset`."""
        if samples <= 0 or samples >= len(self.y_test):
            return self.x_test, self.y_test
        return self.x_test[:samples], self.y_test[:samples]


def eval_set(cfg) -> EvalSet:  # cfg: UdflConfig
    """The coordinator's test set from ``eval-data-path``; a DataError when it is missing or malformed."""
    from datasets.node_local import read_eval_set

    if not cfg.eval_data_path:
        raise DataError("node-local-data=true needs eval-data-path: the coordinator's test set (.npz with x, y, "
                        "num_classes, mean, std; `python -m deploy.export` writes coordinator/unlinkable-dfl/eval.npz)")
    ev, num_classes, mean, std = read_eval_set(cfg.eval_data_path)
    return EvalSet(f"node-local ({cfg.dataset})", [f"evaluated on {cfg.eval_data_path}"], num_classes,
                   _image_shape(ev.x), normalize_images(ev.x, mean, std), torch.from_numpy(ev.y))
