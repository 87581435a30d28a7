"""The unlinkable-dfl study's validated config (a frozen dataclass built once from the run config)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from datasets.registry import DATASETS
from flower_apps.config import ConfigError
from flower_apps.unlinkable_dfl.models import MODELS
from privacy.mixnet.config import COVER_POLICIES
from privacy.mixnet.topology import TOPOLOGIES
from strategies.fragment_pool import AGGREGATORS, KRUM_FALLBACKS

STUDY = "unlinkable-dfl"
ACTION = "unlinkable_dfl"
MODES = ("unlinkable", "baseline")
BYZANTINE_ATTACKS = ("arbitrary", "scaled")

PRESETS: dict[str, dict[str, Any]] = {
    # The paper: N = 32, degree-4 circulant, 10 rounds, MNIST, K = 2, O = 100, mu = 0.1 s.
    "paper": {"num-clients": 32, "num-rounds": 10, "dataset": "mnist"},
    # Seconds: the end-to-end test through Flower's simulation engine.
    "smoke": {"dataset": "mnist-5k", "num-clients": 6, "num-rounds": 2, "data-fraction": 0.5,
              "lr": 0.05, "batch-size": 16, "local-epochs": 2, "udfl-outbox": 10, "udfl-mu": 0.05,
              "clients-per-message": 6, "udfl-eval-samples": 300},
    # Per-run settings of the reduced sweeps (2-core machine, minutes per experiment).
    "reduced": {"dataset": "mnist-5k", "num-clients": 16, "num-rounds": 5, "lr": 0.02, "batch-size": 32,
                "local-epochs": 2, "udfl-outbox": 20, "clients-per-message": 8, "udfl-eval-samples": 300},
}


@dataclass(frozen=True)
class UdflConfig:
    """Everything one unlinkable-dfl run needs; built by :func:`build_config`."""

    num_nodes: int
    num_rounds: int
    seed: int
    dataset: str
    data_dir: str
    data_fraction: float
    test_fraction: float
    alpha: float
    model: str
    lr: float
    momentum: float
    weight_decay: float
    batch_size: int
    local_epochs: int
    mode: str
    mixnet: bool
    max_hops: int
    outbox: int
    mu: float
    sigma: float
    cover: bool
    cover_policy: str
    latency: float
    payload_size: int
    share_ratio: float
    quantize: bool
    aggregator: str
    krum_budget: int
    krum_fallback: str
    topology: str
    degree: int
    round_timeout: float
    churn_leave: float
    churn_join: float
    byzantine_fraction: float
    byzantine_attack: str
    byzantine_scale: float
    curious_node: int
    eval_samples: int
    clients_per_message: int
    device: str
    results_dir: str
    run_name: str
    preset: str

    def to_json(self) -> str:
        """Serialized form carried in every message."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> UdflConfig:
        return cls(**json.loads(text))

    @property
    def encoding(self) -> str:
        """Fragment encoding: 'q8' (8-bit stochastic quantization + zlib) or 'float32' (+ zlib)."""
        return "q8" if self.quantize and self.mode == "unlinkable" else "float32"

    @property
    def transport(self) -> str:
        """'mixnet' (K, O, mu, cover), 'direct' (Sphinx packets straight to the receiver) or 'baseline'."""
        if self.mode == "baseline":
            return "baseline"
        return "mixnet" if self.mixnet else "direct"

    @property
    def default_run_name(self) -> str:
        net = {"mixnet": f"mix-K{self.max_hops}-O{self.outbox}-mu{self.mu:g}", "direct": "direct",
               "baseline": "baseline"}[self.transport]
        parts = [net, self.encoding, f"r{self.share_ratio:g}", self.aggregator, f"a{self.alpha:g}",
                 f"N{self.num_nodes}", f"T{self.num_rounds}", self.dataset, self.model, self.topology]
        if self.churn_leave > 0:
            parts.append(f"churn{self.churn_leave:g}-{self.churn_join:g}")
        if self.byzantine_fraction > 0:
            parts.append(f"byz{self.byzantine_fraction:g}-{self.byzantine_attack}")
        if self.aggregator == "krum":
            parts.append(f"B{self.krum_budget}")
        parts.append(f"s{self.seed}")
        return "_".join(parts)


def _need(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def build_config(c: dict[str, Any]) -> UdflConfig:
    """Validate the flat run config (kebab-case keys) and build the dataclass."""
    n = c["num-clients"]
    _need(_is_int(n) and n >= 3, "num-clients", f"must be an integer >= 3, got {n!r}")
    _need(_is_int(c["num-rounds"]) and c["num-rounds"] >= 1, "num-rounds",
          f"must be an integer >= 1, got {c['num-rounds']!r}")
    _need(_is_int(c["seed"]) and c["seed"] >= 0, "seed", f"must be an integer >= 0, got {c['seed']!r}")
    _need(c["dataset"] in DATASETS, "dataset", f"got {c['dataset']!r}; allowed: {sorted(DATASETS)}")
    _need(0 < c["data-fraction"] <= 1, "data-fraction", f"must be in (0, 1], got {c['data-fraction']}")
    _need(0 < c["test-fraction"] < 1, "test-fraction", f"must be in (0, 1), got {c['test-fraction']}")
    _need(c["udfl-alpha"] > 0, "udfl-alpha", f"must be > 0, got {c['udfl-alpha']}")
    _need(c["udfl-model"] in MODELS, "udfl-model", f"got {c['udfl-model']!r}; allowed: {sorted(MODELS)}")
    _need(c["udfl-model"] == "lenet5" or c["dataset"] == "cifar10", "udfl-model",
          f"{c['udfl-model']!r} needs 3-channel data: use dataset 'cifar10' or udfl-model 'lenet5'")
    _need(c["lr"] > 0, "lr", f"must be > 0, got {c['lr']}")
    _need(0 <= c["momentum"] < 1, "momentum", f"must be in [0, 1), got {c['momentum']}")
    _need(c["weight-decay"] >= 0, "weight-decay", f"must be >= 0, got {c['weight-decay']}")
    _need(_is_int(c["batch-size"]) and c["batch-size"] >= 1, "batch-size",
          f"must be an integer >= 1, got {c['batch-size']!r}")
    _need(_is_int(c["local-epochs"]) and c["local-epochs"] >= 1, "local-epochs",
          f"must be an integer >= 1, got {c['local-epochs']!r}")
    _need(c["udfl-mode"] in MODES, "udfl-mode", f"got {c['udfl-mode']!r}; allowed: {list(MODES)}")
    _need(_is_int(c["udfl-max-hops"]) and 1 <= c["udfl-max-hops"] <= 5, "udfl-max-hops",
          f"must be an integer in [1, 5] (the header's hop capacity), got {c['udfl-max-hops']!r}")
    _need(_is_int(c["udfl-outbox"]) and c["udfl-outbox"] >= 1, "udfl-outbox",
          f"must be an integer >= 1, got {c['udfl-outbox']!r}")
    _need(c["udfl-mu"] > 0, "udfl-mu", f"must be > 0 seconds, got {c['udfl-mu']}")
    _need(c["udfl-sigma"] >= 0, "udfl-sigma", f"must be >= 0 seconds, got {c['udfl-sigma']}")
    _need(c["udfl-cover-policy"] in COVER_POLICIES, "udfl-cover-policy",
          f"got {c['udfl-cover-policy']!r}; allowed: {list(COVER_POLICIES)}")
    _need(c["udfl-latency"] >= 0, "udfl-latency", f"must be >= 0 seconds, got {c['udfl-latency']}")
    _need(_is_int(c["udfl-payload-size"]) and c["udfl-payload-size"] >= 1024, "udfl-payload-size",
          f"must be an integer >= 1024 bytes (room for a SURB and a fragment), got {c['udfl-payload-size']!r}")
    _need(0 < c["udfl-share-ratio"] <= 1, "udfl-share-ratio", f"must be in (0, 1], got {c['udfl-share-ratio']}")
    _need(c["udfl-aggregator"] in AGGREGATORS, "udfl-aggregator",
          f"got {c['udfl-aggregator']!r}; allowed: {sorted(AGGREGATORS)}")
    _need(_is_int(c["udfl-krum-budget"]) and c["udfl-krum-budget"] >= 0, "udfl-krum-budget",
          f"must be an integer >= 0, got {c['udfl-krum-budget']!r}")
    _need(c["udfl-krum-fallback"] in KRUM_FALLBACKS, "udfl-krum-fallback",
          f"got {c['udfl-krum-fallback']!r}; allowed: {list(KRUM_FALLBACKS)}")
    _need(c["udfl-topology"] in TOPOLOGIES, "udfl-topology", f"got {c['udfl-topology']!r}; allowed: {sorted(TOPOLOGIES)}")
    if c["udfl-topology"] != "full-mesh":
        _need(_is_int(c["udfl-degree"]) and 2 <= c["udfl-degree"] < n, "udfl-degree",
              f"must be an integer in [2, num-clients), got {c['udfl-degree']!r}")
    if c["udfl-topology"] == "circulant":
        _need(c["udfl-degree"] % 2 == 0, "udfl-degree", f"must be even for a circulant topology, got {c['udfl-degree']}")
    _need(c["udfl-round-timeout"] > 0, "udfl-round-timeout", f"must be > 0 virtual seconds, got {c['udfl-round-timeout']}")
    _need(0 <= c["udfl-churn-leave"] < 1, "udfl-churn-leave", f"must be in [0, 1), got {c['udfl-churn-leave']}")
    _need(0 <= c["udfl-churn-join"] <= 1, "udfl-churn-join", f"must be in [0, 1], got {c['udfl-churn-join']}")
    _need(0 <= c["udfl-byzantine-fraction"] < 0.5, "udfl-byzantine-fraction",
          f"must be in [0, 0.5), got {c['udfl-byzantine-fraction']}")
    _need(c["udfl-byzantine-attack"] in BYZANTINE_ATTACKS, "udfl-byzantine-attack",
          f"got {c['udfl-byzantine-attack']!r}; allowed: {list(BYZANTINE_ATTACKS)}")
    _need(c["udfl-byzantine-scale"] > 0, "udfl-byzantine-scale", f"must be > 0, got {c['udfl-byzantine-scale']}")
    _need(_is_int(c["udfl-curious-node"]) and -1 <= c["udfl-curious-node"] < n, "udfl-curious-node",
          f"must be -1 (off) or a node id in [0, num-clients), got {c['udfl-curious-node']!r}")
    _need(_is_int(c["udfl-eval-samples"]) and c["udfl-eval-samples"] >= 0, "udfl-eval-samples",
          f"must be an integer >= 0 (0 = the whole test set), got {c['udfl-eval-samples']!r}")
    _need(_is_int(c["clients-per-message"]) and c["clients-per-message"] >= 1, "clients-per-message",
          f"must be an integer >= 1, got {c['clients-per-message']!r}")
    _need(c["device"] in ("auto", "cpu") or str(c["device"]).startswith("cuda"), "device",
          f"got {c['device']!r}; allowed: 'auto', 'cpu', 'cuda', 'cuda:<i>'")
    return UdflConfig(
        num_nodes=int(n), num_rounds=int(c["num-rounds"]), seed=int(c["seed"]), dataset=c["dataset"],
        data_dir=c["data-dir"], data_fraction=float(c["data-fraction"]), test_fraction=float(c["test-fraction"]),
        alpha=float(c["udfl-alpha"]), model=c["udfl-model"], lr=float(c["lr"]), momentum=float(c["momentum"]),
        weight_decay=float(c["weight-decay"]), batch_size=int(c["batch-size"]), local_epochs=int(c["local-epochs"]),
        mode=c["udfl-mode"], mixnet=bool(c["udfl-mixnet"]), max_hops=int(c["udfl-max-hops"]),
        outbox=int(c["udfl-outbox"]), mu=float(c["udfl-mu"]), sigma=float(c["udfl-sigma"]), cover=bool(c["udfl-cover"]),
        cover_policy=c["udfl-cover-policy"], latency=float(c["udfl-latency"]), payload_size=int(c["udfl-payload-size"]),
        share_ratio=float(c["udfl-share-ratio"]), quantize=bool(c["udfl-quantize"]), aggregator=c["udfl-aggregator"],
        krum_budget=int(c["udfl-krum-budget"]), krum_fallback=c["udfl-krum-fallback"], topology=c["udfl-topology"],
        degree=int(c["udfl-degree"]), round_timeout=float(c["udfl-round-timeout"]),
        churn_leave=float(c["udfl-churn-leave"]), churn_join=float(c["udfl-churn-join"]),
        byzantine_fraction=float(c["udfl-byzantine-fraction"]), byzantine_attack=c["udfl-byzantine-attack"],
        byzantine_scale=float(c["udfl-byzantine-scale"]), curious_node=int(c["udfl-curious-node"]),
        eval_samples=int(c["udfl-eval-samples"]), clients_per_message=int(c["clients-per-message"]),
        device=c["device"], results_dir=c["results-dir"], run_name=c["run-name"], preset=c["preset"],
    )
