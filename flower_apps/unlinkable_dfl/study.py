"""Registration of the unlinkable-dfl study with the router."""

from __future__ import annotations

from flower_apps.config import StudySpec
from flower_apps.unlinkable_dfl import client_app, config, server_app

# Run keys this study adds to the common ones (defaults = the paper's values). Keys shared
# with other studies (lr, momentum, ...) keep their defaults; presets override them.
KEYS = {
    "udfl-alpha": 10.0,  # Dirichlet label skew
    "udfl-model": "lenet5",
    "udfl-mode": "unlinkable",  # or "baseline": non-anonymous DFL FedAvg, full models to neighbours
    "udfl-mixnet": True,  # false: Sphinx packets go straight to the receiver (no relays, batching, cover)
    "udfl-max-hops": 2,  # K
    "udfl-outbox": 100,  # O
    "udfl-mu": 0.1,  # mean per-hop delay (s)
    "udfl-sigma": 0.001,  # delay jitter SD (s)
    "udfl-cover": True,
    "udfl-cover-policy": "data",
    "udfl-latency": 0.005,  # one-way link latency (s)
    "udfl-payload-size": 10240,  # Sphinx body bytes
    "udfl-share-ratio": 1.0,  # r: fraction of its fragments a node sends to each neighbour
    "udfl-quantize": True,  # 8-bit stochastic quantization (+ zlib); false: float32 (+ zlib)
    "udfl-aggregator": "fedavg",  # fedavg (FragFedAvg) or krum (FragKrum)
    "udfl-krum-budget": 1,  # B_r
    "udfl-krum-fallback": "median",  # when n_r <= 2 B_r + 2
    "udfl-topology": "circulant",
    "udfl-degree": 4,
    "udfl-round-timeout": 120.0,  # virtual seconds the world waits for a round's fragments
    "udfl-churn-leave": 0.0,  # per round, probability that a live node crashes mid-round
    "udfl-churn-join": 0.5,  # per round, probability that a departed node rejoins
    "udfl-byzantine-fraction": 0.0,
    "udfl-byzantine-attack": "arbitrary",  # or "scaled"
    "udfl-byzantine-scale": 10.0,
    "udfl-curious-node": -1,  # >= 0: run the curious-recipient content-linking analysis at that node
    "udfl-eval-samples": 0,  # test images per node evaluation (0 = all)
    # shared with flower_apps/dfl_dp (same defaults)
    "lr": 0.01,
    "momentum": 0.9,
    "weight-decay": 5e-4,
    "batch-size": 128,
    "local-epochs": 1,
    "test-fraction": 0.2,
    "clients-per-message": 1,
}

SPEC = StudySpec(config.STUDY, config.ACTION, config.PRESETS, config.build_config, server_app.server_main,
                 client_app.train)
