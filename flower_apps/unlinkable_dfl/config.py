"""The unlinkable-dfl study's validated config (a frozen dataclass built once from the run config)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flower_apps.config import need
from flower_apps.unlinkable_dfl.study import ACTION, KEYS, STUDY  # noqa: F401  (re-exported)

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


if TYPE_CHECKING:  # the fields KEYS.config_class derives, written out for the type checker
    from flower_apps.unlinkable_dfl.config_fields import UdflConfigFields as _Fields
else:
    _Fields = object


class _UdflRun(_Fields):
    """What an unlinkable-dfl run derives from its fields (one field per key of KEYS, flower_apps/unlinkable_dfl/study.py).

    ``num_nodes`` is num-clients, ``virtual_round_timeout`` is udfl-round-timeout (simulated network time per
    round), ``round_timeout`` the common wall-clock wait for one phase's replies.
    """

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
        if self.topology != "full-mesh" and self.degree != 4:  # the degree sweep (default 4 keeps old names)
            parts.append(f"d{self.degree}")
        if self.churn_leave > 0:
            parts.append(f"churn{self.churn_leave:g}-{self.churn_join:g}")
        if self.byzantine_fraction > 0:
            parts.append(f"byz{self.byzantine_fraction:g}-{self.byzantine_attack}")
        if self.aggregator == "krum":
            parts.append(f"B{self.krum_budget}")
        parts.append(f"s{self.seed}")
        return "_".join(parts)


if TYPE_CHECKING:
    UdflConfig = _UdflRun
else:
    UdflConfig = KEYS.config_class("UdflConfig", base=_UdflRun,
                                   doc="Everything one unlinkable-dfl run needs (a field per key); built by build_config.")


def build_config(c: dict[str, Any]) -> UdflConfig:
    """Validate the flat run config (kebab-case keys) and build the dataclass."""
    cfg = KEYS.build(UdflConfig, c)  # every single-key check (flower_apps/unlinkable_dfl/study.py)
    need(cfg.model == "lenet5" or cfg.dataset == "cifar10", "udfl-model",
         f"{cfg.model!r} needs 3-channel data: use dataset 'cifar10' or udfl-model 'lenet5'")
    if cfg.topology != "full-mesh":
        need(cfg.degree < cfg.num_nodes, "udfl-degree", f"must be an integer in [2, num-clients), got {cfg.degree!r}")
    if cfg.topology == "circulant":
        need(cfg.degree % 2 == 0, "udfl-degree", f"must be even for a circulant topology, got {cfg.degree}")
    need(cfg.curious_node < cfg.num_nodes, "udfl-curious-node",
         f"must be -1 (off) or a node id in [0, num-clients), got {cfg.curious_node!r}")
    return cfg


def nodes_needed(cfg: UdflConfig) -> int:
    """ceil(N / clients-per-message): the simulated peers travel in messages of clients-per-message peers."""
    return max(1, -(-cfg.num_nodes // cfg.clients_per_message))
