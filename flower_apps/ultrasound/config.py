"""The ultrasound study's validated config (a frozen dataclass built once from the run config)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from datasets.busi import TASKS, ULTRASOUND_SOURCES
from flower_apps.config import ConfigError
from flower_apps.ultrasound.models import ARCHS, check_image_size
from privacy.dpsgd import GRAD_SAMPLE_MODES

STUDY = "ultrasound"
ACTION = "ultrasound"
ALGORITHMS = ("fedavg", "fedprox", "fedadam")
MODES = ("federated", "centralized", "local")
PARTITIONS = ("iid", "non-iid", "label", "quantity", "feature")

# The paper's training recipe (Sec. "Experimental setup"), shared by every preset that trains.
_RECIPE = {"lr": 1e-3, "batch-size": 32, "local-epochs": 5, "dirichlet-alpha": 0.5}

PRESETS: dict[str, dict[str, Any]] = {
    # The paper: K = 8, T = 100, 5 local epochs of batch 32, 224 x 224 (GPU scale).
    "paper": {**_RECIPE, "dataset": "busi", "num-clients": 8, "num-rounds": 100},
    # CPU scale: small images, MobileNetV2, few rounds (the sweep's `cpu` grid, minutes per run on 2 cores).
    "cpu": {**_RECIPE, "dataset": "busi", "num-clients": 8, "num-rounds": 10, "local-epochs": 2,
            "us-image-size": 64, "us-arch": "mobilenetv2_100"},
    # Seconds to a minute on 2 cores: tests and a first look. BUSI when present, else LABELLED synthetic data.
    "smoke": {**_RECIPE, "dataset": "busi", "num-clients": 4, "num-rounds": 2, "local-epochs": 1,
              "data-fraction": 0.5, "us-image-size": 32, "us-arch": "mobilenetv2_100",
              "us-synthetic-fallback": True},
}


@dataclass(frozen=True)
class UltrasoundConfig:
    """Everything one ultrasound run needs; built by :func:`build_config`."""

    mode: str
    algorithm: str
    arch: str
    task: str
    partition: str
    image_size: int
    num_clients: int
    num_rounds: int
    local_epochs: int
    batch_size: int
    lr: float
    dirichlet_alpha: float
    quantity_sigma: float
    feature_skew: float
    proximal_mu: float
    server_lr: float
    beta1: float
    beta2: float
    dp_sgd: bool
    noise_multiplier: float
    max_grad_norm: float
    delta: float
    grad_sample_mode: str
    pretrained: bool
    weights_dir: str
    synthetic_fallback: bool
    dataset: str
    data_dir: str
    data_fraction: float
    seed: int
    device: str
    results_dir: str
    run_name: str
    preset: str
    noise_seed_file: str = ""  # "" = secure DP noise; else a local seed file (privacy.randomness)

    def to_json(self) -> str:
        """Serialized form carried in every message."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "UltrasoundConfig":
        return cls(**json.loads(text))

    def effective(self) -> dict:
        """The fields that can change this run's results (for resume hashing): DP knobs only with DP-SGD,
        mu only for FedProx, the server optimizer only for FedAdam; never output locations, the device or
        the per-sample-gradient implementation (same mathematics, other speed)."""
        d = asdict(self)
        for k in ("results_dir", "run_name", "device", "grad_sample_mode"):
            d.pop(k)
        if not self.dp_sgd:
            for k in ("noise_multiplier", "max_grad_norm", "delta"):
                d[k] = None
        if self.method != "fedprox":
            d["proximal_mu"] = None
        if self.method != "fedadam":
            d["server_lr"] = d["beta1"] = d["beta2"] = None
        return d

    @property
    def dp_label(self) -> str:
        return f"dp-C{self.max_grad_norm:g}-z{self.noise_multiplier:g}" if self.dp_sgd else "nodp"

    @property
    def method(self) -> str:
        """'fedavg' / 'fedprox' / 'fedadam' / 'centralized' / 'local'."""
        return self.algorithm if self.mode == "federated" else self.mode

    @property
    def default_run_name(self) -> str:
        return (f"{self.task}_{self.partition}_{self.arch}_{self.method}_{self.dp_label}_{self.image_size}px_"
                f"K{self.num_clients}_T{self.num_rounds}_E{self.local_epochs}_{self.dataset}_s{self.seed}")


def _need(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def _one_of(c: dict, key: str, allowed) -> None:
    _need(c[key] in allowed, key, f"got {c[key]!r}; allowed: {sorted(allowed)}")


def _int(c: dict, key: str, lo: int) -> None:
    _need(isinstance(c[key], int) and not isinstance(c[key], bool) and c[key] >= lo, key,
          f"must be an integer >= {lo}, got {c[key]!r}")


def build_config(c: dict[str, Any]) -> UltrasoundConfig:
    """Validate the flat run config (kebab-case keys) and build the dataclass."""
    _one_of(c, "us-mode", MODES)
    _one_of(c, "us-algorithm", ALGORITHMS)
    _one_of(c, "us-arch", ARCHS)
    _one_of(c, "us-task", TASKS)
    _one_of(c, "us-partition", PARTITIONS)
    _one_of(c, "dataset", ULTRASOUND_SOURCES)
    _one_of(c, "us-grad-sample-mode", GRAD_SAMPLE_MODES)
    _int(c, "us-image-size", 8)
    try:
        check_image_size(c["us-arch"], c["us-image-size"])
    except ValueError as exc:
        raise ConfigError(f"us-image-size: {exc}") from None
    _int(c, "num-clients", 1)
    _int(c, "num-rounds", 1)
    _int(c, "local-epochs", 1)
    _int(c, "batch-size", 1)
    _int(c, "seed", 0)
    _need(c["lr"] > 0, "lr", f"must be > 0, got {c['lr']}")
    _need(0 < c["data-fraction"] <= 1, "data-fraction", f"must be in (0, 1], got {c['data-fraction']}")
    _need(c["dirichlet-alpha"] > 0, "dirichlet-alpha", f"must be > 0, got {c['dirichlet-alpha']}")
    _need(c["us-quantity-sigma"] >= 0, "us-quantity-sigma", f"must be >= 0, got {c['us-quantity-sigma']}")
    _need(c["us-feature-skew"] >= 0, "us-feature-skew", f"must be >= 0, got {c['us-feature-skew']}")
    _need(c["us-proximal-mu"] >= 0, "us-proximal-mu", f"must be >= 0, got {c['us-proximal-mu']}")
    _need(c["us-server-lr"] > 0, "us-server-lr", f"must be > 0, got {c['us-server-lr']}")
    for k in ("us-beta1", "us-beta2"):
        _need(0 <= c[k] < 1, k, f"must be in [0, 1), got {c[k]}")
    _need(c["us-noise-multiplier"] >= 0, "us-noise-multiplier", f"must be >= 0, got {c['us-noise-multiplier']}")
    _need(c["us-max-grad-norm"] > 0, "us-max-grad-norm", f"must be > 0, got {c['us-max-grad-norm']}")
    _need(0 < c["us-delta"] < 1, "us-delta", f"must be in (0, 1), got {c['us-delta']}")
    _need(c["device"] in ("auto", "cpu") or str(c["device"]).startswith("cuda"), "device",
          f"got {c['device']!r}; allowed: 'auto', 'cpu', 'cuda', 'cuda:<i>'")
    if c["dataset"] == "breastmnist":
        _need(c["us-task"] == "nonmalignant-vs-malignant", "us-task",
              f"BreastMNIST is binary (normal+benign vs malignant); got {c['us-task']!r}, "
              "allowed: ['nonmalignant-vs-malignant']")
    elif c["us-task"] == "nonmalignant-vs-malignant":
        _need(False, "us-task", "'nonmalignant-vs-malignant' is BreastMNIST's task; with BUSI use one of "
              "['benign-vs-malignant', 'normal-vs-abnormal', 'three-class']")
    if c["dataset"] == "synthetic" or c["us-synthetic-fallback"]:
        _need(c["preset"] == "smoke", "dataset" if c["dataset"] == "synthetic" else "us-synthetic-fallback",
              f"synthetic images are for the smoke preset only (got preset={c['preset']!r}); "
              "reported results need real data: put BUSI in ../shared/data/busi/ or pass data-dir")
    return UltrasoundConfig(
        mode=c["us-mode"], algorithm=c["us-algorithm"], arch=c["us-arch"], task=c["us-task"],
        partition=c["us-partition"], image_size=int(c["us-image-size"]), num_clients=int(c["num-clients"]),
        num_rounds=int(c["num-rounds"]), local_epochs=int(c["local-epochs"]), batch_size=int(c["batch-size"]),
        lr=float(c["lr"]), dirichlet_alpha=float(c["dirichlet-alpha"]), quantity_sigma=float(c["us-quantity-sigma"]),
        feature_skew=float(c["us-feature-skew"]), proximal_mu=float(c["us-proximal-mu"]),
        server_lr=float(c["us-server-lr"]), beta1=float(c["us-beta1"]), beta2=float(c["us-beta2"]),
        dp_sgd=bool(c["us-dp-sgd"]), noise_multiplier=float(c["us-noise-multiplier"]),
        max_grad_norm=float(c["us-max-grad-norm"]), delta=float(c["us-delta"]),
        grad_sample_mode=c["us-grad-sample-mode"], pretrained=bool(c["us-pretrained"]),
        weights_dir=str(c["us-weights-dir"]), synthetic_fallback=bool(c["us-synthetic-fallback"]),
        dataset=c["dataset"], data_dir=str(c["data-dir"]), data_fraction=float(c["data-fraction"]),
        seed=int(c["seed"]), device=str(c["device"]), results_dir=str(c["results-dir"]),
        run_name=str(c["run-name"]), preset=str(c["preset"]),
        noise_seed_file=str(c["noise-seed-file"]),
    )
