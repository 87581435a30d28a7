"""The dfl-dp data plan: test set, four-way split and Dirichlet client partition.

Built identically (and cached per process) by the ServerApp and every ClientApp from the
config alone, so messages never carry data or indices.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from datasets.partition import class_counts, dirichlet_partition
from datasets.registry import load_dataset
from datasets.splits import four_way_split, train_and_test
from datasets.transforms import normalize_images
from flower_apps.common.node_data import ImageNode, read_image_node
from flower_apps.common.node_data import image_shape as _image_shape

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


@dataclass
class RawSplit:
    """The plan before normalization: uint8 images, the four parts and the client partition."""

    ds: object  # datasets.base.ArrayDataset
    notes: list[str]
    x_all: np.ndarray
    y_all: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    parts: dict[str, np.ndarray]  # indices into x_all
    clients: list[np.ndarray]  # indices into x_all[parts[train_part]]
    train_part: str


def raw_split(key: DataKey) -> RawSplit:
    """Load, hold out a test set if needed, subsample, split four ways, partition (raw uint8 images).

    What :func:`build_data_plan` normalizes, and what ``python -m deploy.export`` writes to the
    nodes' folders: one function, so an exported deployment holds exactly the simulated partition.
    """
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
    return RawSplit(ds, notes, x_all, y_all, x_test, y_test, parts, clients, train_part)


@functools.lru_cache(maxsize=4)
def build_data_plan(key: DataKey) -> DataPlan:
    """The normalized :func:`raw_split`. Cached."""
    raw = raw_split(key)
    ds, notes = raw.ds, raw.notes
    xs = {"test": normalize_images(raw.x_test, ds.mean, ds.std)}
    ys = {"test": torch.from_numpy(np.asarray(raw.y_test, dtype=np.int64))}
    for name, idx in raw.parts.items():
        xs[name] = normalize_images(raw.x_all[idx], ds.mean, ds.std)
        ys[name] = torch.from_numpy(raw.y_all[idx].astype(np.int64))
    if ds.reduced:
        log.warning("REDUCED DATASET %s: %s", ds.name, "; ".join(notes))
    return DataPlan(ds.name, notes, ds.num_classes, ds.image_shape, ds.mean, ds.std, xs, ys, raw.clients,
                    raw.train_part)


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


# --- Deployment with node-local data (datasets.node_local): a node reads only its data-path.
@dataclass
class NodeClients(ImageNode):
    """The logical clients one node holds, with the attributes ``client_app.train`` reads from a DataPlan."""

    client_indices: dict[int, np.ndarray] = field(default_factory=dict)  # positions in the node's own file

    def client_data(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[cid], self.y[cid]


@functools.lru_cache(maxsize=2)
def node_clients(data_path: str, node: str) -> NodeClients:
    """The node's clients from ``<data-path>[/dfl-dp]/node.json`` (images-npz); NodeDataError if unusable."""
    base, raw = read_image_node(data_path, "dfl-dp", node)
    return NodeClients(**vars(base), client_indices={c: np.arange(len(v.y)) for c, v in raw.items()})


@dataclass
class EvalPlan:
    """The coordinator's side of a node-local deployment: its held-out test set and the nodes' label counts."""

    name: str
    notes: list[str]
    num_classes: int
    image_shape: tuple[int, int, int]
    x: dict[str, torch.Tensor]  # 'test' only: the coordinator holds no training data
    y: dict[str, torch.Tensor]
    counts: np.ndarray  # (num_clients, num_classes), from the nodes' describe replies (0 for missing clients)

    def class_counts(self) -> np.ndarray:
        return self.counts

    @property
    def n_train(self) -> int:
        return int(self.counts.sum())


def eval_plan(cfg) -> EvalPlan:  # cfg: DflDpConfig
    """The coordinator's test set from ``eval-data-path``; a DataError when it is missing or malformed."""
    from datasets.base import DataError
    from datasets.node_local import read_eval_set

    if not cfg.eval_data_path:
        raise DataError("node-local-data=true needs eval-data-path: the coordinator's test set (.npz with x, y, "
                        "num_classes, mean, std; `python -m deploy.export` writes coordinator/dfl-dp/eval.npz)")
    ev, num_classes, mean, std = read_eval_set(cfg.eval_data_path)
    return EvalPlan(f"node-local ({cfg.dataset})", [f"evaluated on {cfg.eval_data_path}"], num_classes,
                    _image_shape(ev.x), {"test": normalize_images(ev.x, mean, std)}, {"test": torch.from_numpy(ev.y)},
                    np.zeros((cfg.num_clients, num_classes), dtype=np.int64))
