"""The image data plan for membership-inference studies: test set, target/shadow split, Dirichlet clients.

One source is loaded, a test set is held out when the source has none, a stratified fraction of
the training images is kept, and the rest is split four ways (target-train, target-holdout,
shadow-train, shadow-holdout; seed paper, Sec. 3.1). The clients hold a Dirichlet label-skewed
partition of target-train, or of shadow-train for the attacker's shadow federation.

Everything is a function of an :class:`ImagePlanKey` (plain values), so a ServerApp and every
ClientApp build the same plan from the config alone and messages never carry data or indices.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from datasets.base import ArrayDataset, DataError
from datasets.partition import class_counts, dirichlet_partition
from datasets.registry import DATASETS, load_dataset
from datasets.splits import FOUR_WAY_SIZES, check_four_way_sizes, four_way_split, train_and_test
from datasets.transforms import normalize_images
from registry import streams

log = logging.getLogger(__name__)

#: the held-out test set (when the source has none) is the same for every seed
TEST_HOLDOUT_SEED = 0
#: which half of the four-way split the clients hold, and the random stream of its partition
#: (the shadow data is partitioned like the target data, same N and alpha, with its own stream)
DATA_PARTS = {"target": "datasets.partition", "shadow": "datasets.shadow-partition"}


@dataclass(frozen=True)
class ImagePlanKey:
    """Everything an image data plan depends on; hashable (the plan cache's key).

    Parameters
    ----------
    dataset : a name registered in :data:`datasets.registry.DATASETS` ("mnist", "fashion-mnist", ...).
    num_clients : clients of the Dirichlet partition (>= 1).
    dirichlet_alpha : concentration of the label skew (> 0; small is more skewed).
    seed : the run seed (>= 0) of the subsample, the four-way split and the partition.
    data_dir : where the source's files are ('' = the default places).
    data_fraction : stratified fraction of the training images kept, in (0, 1].
    test_fraction : fraction held out as the test set when the source has none, in (0, 1).
    data_part : "target" (clients hold target-train) or "shadow" (shadow-train: the attacker's federation).
    split_sizes : proportions of (target_train, target_holdout, shadow_train, shadow_holdout).
    """

    dataset: str
    num_clients: int
    dirichlet_alpha: float
    seed: int
    data_dir: str = ""
    data_fraction: float = 1.0
    test_fraction: float = 0.2
    data_part: str = "target"
    split_sizes: tuple[int, int, int, int] = FOUR_WAY_SIZES

    def __post_init__(self) -> None:
        # Checked here, before any file is read: a bad plan fails in microseconds with one line.
        if self.dataset not in DATASETS:
            raise DataError(f"unknown dataset {self.dataset!r}; allowed: {sorted(DATASETS)}")
        if not _is_int(self.num_clients) or self.num_clients < 1:
            raise ValueError(f"num_clients must be an integer >= 1, got {self.num_clients!r}")
        if not (isinstance(self.dirichlet_alpha, (int, float)) and math.isfinite(self.dirichlet_alpha)
                and self.dirichlet_alpha > 0):
            raise ValueError(f"dirichlet_alpha must be a finite number > 0, got {self.dirichlet_alpha!r}")
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if not 0 < self.data_fraction <= 1:
            raise ValueError(f"data_fraction must be in (0, 1], got {self.data_fraction!r}")
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction!r}")
        if self.data_part not in DATA_PARTS:
            raise ValueError(f"data_part must be one of {sorted(DATA_PARTS)}, got {self.data_part!r}")
        check_four_way_sizes(self.split_sizes)
        object.__setattr__(self, "split_sizes", tuple(int(s) for s in self.split_sizes))

    @property
    def train_part(self) -> str:
        """The part the clients hold: 'target_train' or 'shadow_train'."""
        return f"{self.data_part}_train"


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


@dataclass
class RawImageSplit:
    """The plan before normalization: uint8 images, the four parts and the client partition."""

    ds: ArrayDataset
    notes: list[str]
    x_all: np.ndarray  # the kept training images (after the test holdout and the data fraction)
    y_all: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    parts: dict[str, np.ndarray]  # indices into x_all: 'target_train', 'target_holdout', 'shadow_train', ...
    clients: list[np.ndarray]  # indices into x_all[parts[train_part]]
    train_part: str


@dataclass
class ImagePlan:
    """Normalized tensors for every part, and each client's indices into its train part."""

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
        """Client ``cid``'s images and labels."""
        idx = torch.from_numpy(self.client_indices[cid])
        return self.x[self.train_part][idx], self.y[self.train_part][idx]

    def class_counts(self) -> np.ndarray:
        """Per-client class counts, shape (num_clients, num_classes)."""
        return class_counts(self.y[self.train_part].numpy(), self.client_indices, self.num_classes)


def raw_image_split(key: ImagePlanKey) -> RawImageSplit:
    """Load, hold out a test set if needed, subsample, split four ways, partition (raw uint8 images).

    What :func:`build_image_plan` normalizes, and what ``python -m deploy.export`` writes to the
    nodes' folders: one function, so an exported deployment holds exactly the simulated partition.

    Raises
    ------
    DataError
        The source is unusable, or the train part has fewer images than ``key.num_clients``.
    """
    ds = load_dataset(key.dataset, key.data_dir or None)
    x_all, y_all, x_test, y_test, done = train_and_test(ds.x_train, ds.y_train, ds.x_test, ds.y_test,
                                                        key.test_fraction, key.data_fraction, key.seed,
                                                        TEST_HOLDOUT_SEED, " before the four-way split")
    notes = list(ds.notes) + done
    parts = four_way_split(y_all, key.seed, key.split_sizes)
    train_part = key.train_part
    tt = parts[train_part]
    if key.num_clients > len(tt):
        raise DataError(f"num_clients ({key.num_clients}) is larger than the {train_part} samples ({len(tt)}): "
                        "use fewer clients or more data")
    rng = streams.rng(DATA_PARTS[key.data_part], key.seed)
    clients = dirichlet_partition(y_all[tt], key.num_clients, rng, alpha=key.dirichlet_alpha, min_size=1)
    return RawImageSplit(ds, notes, x_all, y_all, x_test, y_test, parts, clients, train_part)


@functools.lru_cache(maxsize=4)
def build_image_plan(key: ImagePlanKey) -> ImagePlan:
    """The normalized :func:`raw_image_split`. Cached per key (ServerApp and ClientApps share a process)."""
    raw = raw_image_split(key)
    ds, notes = raw.ds, raw.notes
    xs = {"test": normalize_images(raw.x_test, ds.mean, ds.std)}
    ys = {"test": torch.from_numpy(np.asarray(raw.y_test, dtype=np.int64))}
    for name, idx in raw.parts.items():
        xs[name] = normalize_images(raw.x_all[idx], ds.mean, ds.std)
        ys[name] = torch.from_numpy(raw.y_all[idx].astype(np.int64))
    if ds.reduced:
        log.warning("REDUCED DATASET %s: %s", ds.name, "; ".join(notes))
    return ImagePlan(ds.name, notes, ds.num_classes, ds.image_shape, ds.mean, ds.std, xs, ys, raw.clients,
                     raw.train_part)
