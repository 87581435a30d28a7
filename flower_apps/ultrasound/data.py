"""The ultrasound data plan: source -> preprocessing -> task -> splits -> K client partitions.

Built identically (and cached per process) by the ServerApp and every ClientApp from the
config alone, so messages never carry data or indices. Images are stored preprocessed
(bicubic resize, CLAHE, blur) as uint8; augmentation and normalization happen per batch.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import torch

from datasets.busi import TASKS, UltrasoundImages, global_splits, load_ultrasound
from datasets.partition import partition
from datasets.transforms import IDENTITY_PROFILE, ScannerProfile, preprocess_many, scanner_profiles
from datasets.ultrasound_partition import client_validation_sets, partition_table
from registry import streams

log = logging.getLogger(__name__)

# us-partition -> (label skew, quantity skew, feature skew)
PARTITION_KINDS = {
    "iid": (False, False, False),
    "non-iid": (True, True, True),
    "label": (True, False, False),
    "quantity": (False, True, False),
    "feature": (False, False, True),
}


@dataclass(frozen=True)
class DataKey:
    """The config fields the data plan depends on."""

    dataset: str
    data_dir: str
    synthetic_fallback: bool
    image_size: int
    task: str
    data_fraction: float
    seed: int
    partition: str
    num_clients: int
    dirichlet_alpha: float
    quantity_sigma: float
    feature_skew: float


@dataclass
class UltrasoundData:
    """Preprocessed uint8 images per split, client indices into 'train' / 'val', scanner profiles."""

    name: str
    synthetic: bool
    notes: list[str]
    class_names: tuple[str, ...]
    x: dict[str, torch.Tensor]  # 'train', 'val', 'test': uint8 (n, S, S)
    y: dict[str, torch.Tensor]  # int64 (n,)
    client_train: list[np.ndarray]
    client_val: list[np.ndarray]
    profiles: list[ScannerProfile]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def client_train_data(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.client_train[k])
        return self.x["train"][idx], self.y["train"][idx]

    def client_val_data(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.client_val[k])
        return self.x["val"][idx], self.y["val"][idx]

    def train_owners(self) -> np.ndarray:
        """Client id of every 'train' image (for the centralized baseline's per-scanner augmentation)."""
        owner = np.full(len(self.y["train"]), -1, dtype=np.int64)
        for k, idx in enumerate(self.client_train):
            owner[idx] = k
        return owner

    def partition_rows(self) -> list[dict]:
        """The paper's Table 2 for this plan (train partition, plus each client's validation size)."""
        rows = partition_table(self.y["train"].numpy(), self.client_train, self.class_names)
        for row, v, prof in zip(rows, self.client_val, self.profiles):
            row["val size"] = int(len(v))
            row["brightness"] = f"[{prof.brightness[0]:+.2f}, {prof.brightness[1]:+.2f}]"
            row["contrast"] = f"[{prof.contrast[0]:.2f}, {prof.contrast[1]:.2f}]"
            row["rotation (deg)"] = f"+-{prof.rotation_deg:.0f}"
        return rows


@functools.lru_cache(maxsize=2)
def _source(dataset: str, data_dir: str, fallback: bool) -> UltrasoundImages:
    return load_ultrasound(dataset, data_dir or None, allow_synthetic_fallback=fallback)


@functools.lru_cache(maxsize=2)
def _preprocessed(dataset: str, data_dir: str, fallback: bool, size: int) -> np.ndarray:
    return preprocess_many(_source(dataset, data_dir, fallback).images, size)


@functools.lru_cache(maxsize=4)
def build_data(key: DataKey) -> UltrasoundData:
    """Load, preprocess, apply the task, split (10% test with a fixed seed, 80/10 train/val) and partition."""
    src = _source(key.dataset, key.data_dir, key.synthetic_fallback)
    images = _preprocessed(key.dataset, key.data_dir, key.synthetic_fallback, key.image_size)
    task = TASKS[key.task]
    keep, task_labels = task.apply(src.labels, src.class_names)
    # Splits on the *base* labels of all images, so every task shares the same test images.
    splits = global_splits(src.labels, key.seed, key.data_fraction)
    pos = np.full(len(src.labels), -1)
    pos[keep] = np.arange(len(keep))
    x, y = {}, {}
    for part, idx in splits.items():
        idx = idx[pos[idx] >= 0]
        x[part] = torch.from_numpy(images[idx])
        y[part] = torch.from_numpy(task_labels[pos[idx]].astype(np.int64))
    label_skew, quantity_skew, feature_skew = PARTITION_KINDS[key.partition]
    ytr = y["train"].numpy()
    if key.num_clients > len(ytr):
        raise ValueError(f"num-clients ({key.num_clients}) is larger than the training set ({len(ytr)})")
    if label_skew or quantity_skew:
        clients = partition("label-quantity-skew", ytr, key.num_clients, key.seed, alpha=key.dirichlet_alpha,
                            sigma=key.quantity_sigma, label_skew=label_skew, quantity_skew=quantity_skew,
                            min_size=min(2, len(ytr) // key.num_clients))
    else:
        clients = partition("iid", ytr, key.num_clients, key.seed)
    vals = client_validation_sets(np.arange(len(y["val"])), np.array([len(c) for c in clients]),
                                  streams.rng("ultrasound.partition", key.seed))
    profiles = (scanner_profiles(key.num_clients, streams.rng("ultrasound.scanner-profiles", key.seed), key.feature_skew)
                if feature_skew else [IDENTITY_PROFILE] * key.num_clients)
    notes = list(src.notes) + [f"task {task.name}: {len(ytr)} train / {len(y['val'])} val / {len(y['test'])} test"]
    if key.data_fraction < 1:
        notes.append(f"data-fraction {key.data_fraction}: the non-test pool was subsampled")
    if src.synthetic:
        log.warning("SYNTHETIC DATA in use (%s): results are not comparable to anything", src.name)
    return UltrasoundData(src.name, src.synthetic, notes, task.class_names, x, y, clients, vals, profiles)


def data_key(cfg) -> DataKey:  # cfg: UltrasoundConfig (duck-typed)
    """The DataKey of an ultrasound config."""
    return DataKey(cfg.dataset, cfg.data_dir, cfg.synthetic_fallback, cfg.image_size, cfg.task, cfg.data_fraction,
                   cfg.seed, cfg.partition, cfg.num_clients, cfg.dirichlet_alpha, cfg.quantity_sigma,
                   cfg.feature_skew)


def validate_data(cfg) -> UltrasoundData | None:  # cfg: UltrasoundConfig
    """Build the run's data plan on the server before any work, so unusable data fails in seconds.

    Raises :class:`datasets.base.DataError` naming the folder or file (a data-dir that does
    not exist, an empty class folder, an undecodable image) before the ServerApp creates its
    run folder. The plan is cached, so the ServerApp's own ``build_data`` call is free.
    """
    if cfg.node_local_data:  # the coordinator holds only its test/ and val/ folders (eval-data-path)
        validate_coordinator_data(cfg)
        return None
    return build_data(data_key(cfg))


# --- Deployment with node-local data (datasets.node_local, busi-folder): a node reads only its data-path.
def _profiles(key: DataKey) -> list[ScannerProfile]:
    """Per-client scanner profiles: drawn from the seed alone (no data), identical on every node."""
    feature_skew = PARTITION_KINDS[key.partition][2]
    return (scanner_profiles(key.num_clients, streams.rng("ultrasound.scanner-profiles", key.seed), key.feature_skew)
            if feature_skew else [IDENTITY_PROFILE] * key.num_clients)


def _task_images(src: UltrasoundImages, key: DataKey) -> tuple[torch.Tensor, torch.Tensor]:
    """Preprocess a folder's raw images and apply the task (images of dropped classes leave)."""
    keep, labels = TASKS[key.task].apply(src.labels, src.class_names)
    images = preprocess_many([src.images[i] for i in keep], key.image_size)
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


@dataclass(frozen=True)
class ExportLayout:
    """What :mod:`deploy.export` writes: raw base-labelled images and, in the simulation's order,
    each client's training images and the held-out test / validation pools (indices into ``images``)."""

    images: list[np.ndarray]
    labels: np.ndarray
    class_names: tuple[str, ...]
    client_train: list[np.ndarray]
    held_out: dict[str, np.ndarray]


def export_layout(cfg) -> ExportLayout:  # cfg: UltrasoundConfig
    """The simulated partition of ``cfg`` in source-image indices (same splits as :func:`build_data`)."""
    key = data_key(cfg)
    src = _source(key.dataset, key.data_dir, key.synthetic_fallback)
    data = build_data(key)
    keep, _ = TASKS[key.task].apply(src.labels, src.class_names)
    kept = np.zeros(len(src.labels), dtype=bool)
    kept[keep] = True
    base = {part: idx[kept[idx]] for part, idx in global_splits(src.labels, key.seed, key.data_fraction).items()}
    return ExportLayout(src.images, src.labels, src.class_names, [base["train"][c] for c in data.client_train],
                        {"test": base["test"], "val": base["val"]})


@dataclass
class NodeUltrasound:
    """The logical clients one node holds (preprocessed, task applied), with what ``client_app.train`` reads."""

    node: str
    class_names: tuple[str, ...]
    x: dict[int, torch.Tensor]
    y: dict[int, torch.Tensor]
    profiles: list[ScannerProfile]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def client_train_data(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[k], self.y[k]

    def owners(self, k: int) -> np.ndarray:
        return np.full(len(self.y[k]), k, dtype=np.int64)

    def sizes(self) -> dict[int, int]:
        return {c: len(v) for c, v in self.y.items()}

    def label_counts(self) -> dict[int, list[int]]:
        return {c: np.bincount(v.numpy(), minlength=self.num_classes).tolist() for c, v in self.y.items()}


@functools.lru_cache(maxsize=2)
def node_clients(data_path: str, node: str, key: DataKey) -> NodeUltrasound:
    """The node's clients from ``<data-path>[/ultrasound]/node.json`` (busi-folder); NodeDataError if unusable."""
    from datasets.node_local import node_folder, read_busi_clients, read_manifest

    m = read_manifest(node_folder(data_path, "ultrasound"), "busi-folder", node)
    x, y = {}, {}
    for cid, src in read_busi_clients(m).items():
        x[cid], y[cid] = _task_images(src, key)
        if not len(y[cid]):
            raise m.fail(m.clients[cid], f"no image of the task {key.task!r}'s classes")
    return NodeUltrasound(m.node, TASKS[key.task].class_names, x, y, _profiles(key))


def coordinator_data(cfg, sizes: dict[int, int], label_counts: dict[int, list[int]]) -> UltrasoundData:
    """The coordinator's side of a node-local run: its held-out test and validation pools (eval-data-path).

    Nothing of the clients' images: 'train' holds only the *labels* the nodes reported in their describe
    replies (per-client class counts, for Table 2 and the sizes), ``x['train']`` is empty. The validation
    pool is split over the clients in proportion to those sizes, as the simulation does.
    """
    from datasets.base import DataError
    from datasets.node_local import NodeDataError, read_busi_folder

    key = data_key(cfg)
    root = _coordinator_root(cfg)

    def fail(where, problem):
        return NodeDataError(f"coordinator eval-data-path {where}: {problem}")

    x, y = {}, {}
    for part in ("test", "val"):
        x[part], y[part] = _task_images(read_busi_folder(root / part, fail), key)
    k, task = cfg.num_clients, TASKS[key.task]
    counts = [label_counts.get(c, [0] * task.num_classes) for c in range(k)]
    y_train = np.concatenate([np.repeat(np.arange(task.num_classes), cnt) for cnt in counts]).astype(np.int64)
    ends = np.cumsum([sizes.get(c, 0) for c in range(k)])
    clients = [np.arange(e - s, e) for s, e in zip([sizes.get(c, 0) for c in range(k)], ends)]
    if int(ends[-1]) != len(y_train):
        raise DataError(f"the nodes' reported sizes ({int(ends[-1])}) and label counts ({len(y_train)}) disagree")
    vals = client_validation_sets(np.arange(len(y["val"])), np.array([len(c) for c in clients]),
                                  streams.rng("ultrasound.partition", key.seed))
    x["train"], y["train"] = torch.zeros((0, key.image_size, key.image_size), dtype=torch.uint8), torch.from_numpy(y_train)
    notes = [f"node-local deployment: {len(y_train)} train images on the nodes; test/val from {root}"]
    return UltrasoundData(f"node-local ({cfg.dataset})", False, notes, task.class_names, x, y, clients, vals,
                          _profiles(key))


def _coordinator_root(cfg):
    """``eval-data-path``: a folder with ``test/`` and ``val/`` in the BUSI layout; a DataError when absent."""
    from pathlib import Path

    from datasets.node_local import NodeDataError

    if not cfg.eval_data_path:
        raise NodeDataError("node-local-data=true needs eval-data-path: the coordinator's folder with test/ and "
                            "val/ in the BUSI layout (the paper's global held-out sets; `python -m deploy.export "
                            "--study ultrasound` writes coordinator/ultrasound/)")
    root = Path(cfg.eval_data_path)
    if not root.is_dir():
        raise NodeDataError(f"coordinator eval-data-path {root}: not a folder (expected test/ and val/ in the "
                            "BUSI layout)")
    return root


def validate_coordinator_data(cfg) -> None:
    """Check the coordinator's test/val folders before any message (sizes come later, from the nodes)."""
    coordinator_data(cfg, {0: 1}, {0: [1] + [0] * (TASKS[cfg.task].num_classes - 1)})
