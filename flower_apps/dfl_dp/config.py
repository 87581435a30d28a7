"""The dfl-dp study's validated config (a frozen dataclass built once from the run config)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from datasets.registry import DATASETS
from flower_apps.config import ConfigError
from strategies.registry import FRAMEWORKS

STUDY = "dfl-dp"
ACTION = "dfl_dp"

PRESETS: dict[str, dict[str, Any]] = {
    # The paper: N = 100, T = 100, full MNIST when present (else the offline subset, logged).
    "paper": {},
    # Seconds on a laptop: for tests and a first look.
    "smoke": {"dataset": "mnist-5k", "num-clients": 10, "num-rounds": 2, "data-fraction": 0.5,
              "clients-per-message": 5},
    # The reduced grid's per-run settings (minutes for the whole grid on 2 cores).
    "reduced": {"dataset": "mnist", "num-clients": 100, "num-rounds": 20, "clients-per-message": 50},
    # Protocol-scale split (40,000/5,000/10,000/5,000) on data that is available offline.
    "protocol-fashion": {"dataset": "fashion-mnist", "num-clients": 100, "num-rounds": 100,
                         "clients-per-message": 50},
}


@dataclass(frozen=True)
class DflDpConfig:
    """Everything one dfl-dp run needs; built by :func:`build_config`."""

    framework: str
    dp: bool
    clip_norm: float
    eps_cal: float
    delta_cal: float
    delta_total: float
    num_clients: int
    num_rounds: int
    seed: int
    dataset: str
    data_dir: str
    data_fraction: float
    test_fraction: float
    dirichlet_alpha: float
    lr: float
    momentum: float
    weight_decay: float
    batch_size: int
    local_epochs: int
    grad_clip: float
    clients_per_message: int
    device: str
    results_dir: str
    run_name: str
    preset: str
    data_part: str = "target"
    capture_victims: int = 0
    attack_round: int = 0
    round_timeout: float = 3600.0
    noise_seed_file: str = ""  # "" = secure DP noise; else a local seed file (privacy.randomness)

    @property
    def victim_round(self) -> int:
        """The round whose pre-update model states and gradients are captured (0 = the last)."""
        return self.attack_round or self.num_rounds

    def to_json(self) -> str:
        """Serialized form carried in every message."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DflDpConfig":
        """Inverse of :meth:`to_json`."""
        return cls(**json.loads(text))

    @property
    def condition(self) -> str:
        """'nodp' or 'C{C}_eps{eps}' (used in run names and tables)."""
        return "nodp" if not self.dp else f"C{self.clip_norm:g}_eps{self.eps_cal:g}"

    @property
    def default_run_name(self) -> str:
        shadow = "_shadow" if self.data_part == "shadow" else ""
        return (f"{self.framework}_{self.condition}_N{self.num_clients}_T{self.num_rounds}_{self.dataset}"
                f"_s{self.seed}{shadow}")


def _need(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def build_config(c: dict[str, Any]) -> DflDpConfig:
    """Validate the flat run config (kebab-case keys) and build the dataclass."""
    _need(c["framework"] in FRAMEWORKS, "framework", f"got {c['framework']!r}; allowed: {sorted(FRAMEWORKS)}")
    _need(c["clip-norm"] > 0, "clip-norm", f"must be > 0, got {c['clip-norm']}")
    _need(c["eps-cal"] > 0, "eps-cal", f"must be > 0, got {c['eps-cal']}")
    _need(0 < c["delta-cal"] < 1, "delta-cal", f"must be in (0, 1), got {c['delta-cal']}")
    _need(0 < c["delta-total"] < 1, "delta-total", f"must be in (0, 1), got {c['delta-total']}")
    _need(isinstance(c["num-clients"], int) and c["num-clients"] >= 2, "num-clients",
          f"must be an integer >= 2, got {c['num-clients']}")
    _need(isinstance(c["num-rounds"], int) and c["num-rounds"] >= 1, "num-rounds",
          f"must be an integer >= 1, got {c['num-rounds']}")
    _need(c["dataset"] in DATASETS, "dataset", f"got {c['dataset']!r}; allowed: {sorted(DATASETS)}")
    _need(0 < c["data-fraction"] <= 1, "data-fraction", f"must be in (0, 1], got {c['data-fraction']}")
    _need(0 < c["test-fraction"] < 1, "test-fraction", f"must be in (0, 1), got {c['test-fraction']}")
    _need(c["dirichlet-alpha"] > 0, "dirichlet-alpha", f"must be > 0, got {c['dirichlet-alpha']}")
    _need(c["lr"] > 0, "lr", f"must be > 0, got {c['lr']}")
    _need(0 <= c["momentum"] < 1, "momentum", f"must be in [0, 1), got {c['momentum']}")
    _need(c["weight-decay"] >= 0, "weight-decay", f"must be >= 0, got {c['weight-decay']}")
    _need(isinstance(c["batch-size"], int) and c["batch-size"] >= 1, "batch-size", f"must be >= 1, got {c['batch-size']}")
    _need(isinstance(c["local-epochs"], int) and c["local-epochs"] >= 1, "local-epochs",
          f"must be >= 1, got {c['local-epochs']}")
    _need(c["grad-clip"] > 0, "grad-clip", f"must be > 0, got {c['grad-clip']}")
    _need(isinstance(c["clients-per-message"], int) and c["clients-per-message"] >= 1, "clients-per-message",
          f"must be an integer >= 1, got {c['clients-per-message']}")
    _need(c["device"] == "auto" or c["device"] == "cpu" or c["device"].startswith("cuda"), "device",
          f"got {c['device']!r}; allowed: 'auto', 'cpu', 'cuda', 'cuda:<i>'")
    _need(isinstance(c["seed"], int) and c["seed"] >= 0, "seed", f"must be an integer >= 0, got {c['seed']}")
    _need(c["round-timeout"] > 0, "round-timeout", f"must be > 0 seconds, got {c['round-timeout']}")
    _need(c["data-part"] in ("target", "shadow"), "data-part", f"got {c['data-part']!r}; allowed: 'target', 'shadow'")
    _need(isinstance(c["capture-victims"], int) and 0 <= c["capture-victims"] <= c["num-clients"], "capture-victims",
          f"must be an integer in [0, num-clients], got {c['capture-victims']}")
    _need(isinstance(c["attack-round"], int) and 0 <= c["attack-round"] <= c["num-rounds"], "attack-round",
          f"must be an integer in [0, num-rounds] (0 = last round), got {c['attack-round']}")
    return DflDpConfig(
        framework=c["framework"], dp=bool(c["dp"]), clip_norm=float(c["clip-norm"]), eps_cal=float(c["eps-cal"]),
        delta_cal=float(c["delta-cal"]), delta_total=float(c["delta-total"]), num_clients=int(c["num-clients"]),
        num_rounds=int(c["num-rounds"]), seed=int(c["seed"]), dataset=c["dataset"], data_dir=c["data-dir"],
        data_fraction=float(c["data-fraction"]), test_fraction=float(c["test-fraction"]),
        dirichlet_alpha=float(c["dirichlet-alpha"]), lr=float(c["lr"]), momentum=float(c["momentum"]),
        weight_decay=float(c["weight-decay"]), batch_size=int(c["batch-size"]), local_epochs=int(c["local-epochs"]),
        grad_clip=float(c["grad-clip"]), clients_per_message=int(c["clients-per-message"]), device=c["device"],
        results_dir=c["results-dir"], run_name=c["run-name"], preset=c["preset"], data_part=c["data-part"],
        capture_victims=int(c["capture-victims"]), attack_round=int(c["attack-round"]),
        round_timeout=float(c["round-timeout"]), noise_seed_file=str(c["noise-seed-file"]),
    )
