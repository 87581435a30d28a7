"""The dfl-dp data plan: :mod:`datasets.image_plan` keyed by the dfl-dp config, and node-local data.

Built identically (and cached per process) by the ServerApp and every ClientApp from the
config alone, so messages never carry data or indices.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from datasets.image_plan import ImagePlan, ImagePlanKey, build_image_plan
from datasets.transforms import normalize_images
from flower_apps.common.node_data import ImageNode, read_image_node
from flower_apps.common.node_data import image_shape as _image_shape


def data_key(cfg) -> ImagePlanKey:  # cfg: DflDpConfig (duck-typed to keep this module config-agnostic)
    """The image-plan key of a dfl-dp config."""
    return ImagePlanKey(dataset=cfg.dataset, num_clients=cfg.num_clients, dirichlet_alpha=cfg.dirichlet_alpha,
                        seed=cfg.seed, data_dir=cfg.data_dir, data_fraction=cfg.data_fraction,
                        test_fraction=cfg.test_fraction, data_part=cfg.data_part)


def validate_data(cfg) -> ImagePlan:  # cfg: DflDpConfig
    """Build the run's data plan on the server before any work, so unusable data fails in seconds.

    Raises :class:`datasets.base.DataError` (one line naming the path) before the ServerApp
    creates its run folder or sends a message. The plan is cached, so the ServerApp's own
    ``build_image_plan`` call right after is free.
    """
    return build_image_plan(data_key(cfg))


# --- Deployment with node-local data (datasets.node_local): a node reads only its data-path.
@dataclass
class NodeClients(ImageNode):
    """The logical clients one node holds, with the attributes ``client_app.train`` reads from an ImagePlan."""

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
