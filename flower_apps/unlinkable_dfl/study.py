"""The unlinkable-dfl study: its name, ClientApp action and run keys (defaults = the paper's values).

Keys shared with other studies (lr, momentum, ...) keep their defaults; presets override them.
Imports nothing else of this package but its registries: config.py reads ``KEYS`` from here.
"""

from __future__ import annotations

from datasets.registry import DATASETS
from flower_apps.config import COMMON_KEYS, SHARED_KEYS, Key, KeyTable
from flower_apps.unlinkable_dfl.fragment_pool import AGGREGATORS, KRUM_FALLBACKS
from flower_apps.unlinkable_dfl.models import MODELS
from mixnet.config import COVER_POLICIES
from mixnet.topology import TOPOLOGIES

STUDY = "unlinkable-dfl"
ACTION = "unlinkable_dfl"
MODES = ("unlinkable", "baseline")
BYZANTINE_ATTACKS = ("arbitrary", "scaled")

KEYS = KeyTable(STUDY, (
    COMMON_KEYS["num-clients"].refine(ge=3, field="num_nodes"),
    COMMON_KEYS["noise-seed-file"].refine(held=False),  # no DP noise in this study: its config holds no seed file
    COMMON_KEYS["dataset"].refine(choices=DATASETS),
    # mnist-5k is the built-in offline subset (datasets/registry.py): it reads no files
    COMMON_KEYS["data-dir"].refine(unused_when={"dataset": ("mnist-5k",)}),
    Key("udfl-alpha", 10.0, float, gt=0, field="alpha", doc="Dirichlet label skew across nodes"),
    Key("udfl-model", "lenet5", str, choices=MODELS, field="model",
        doc="node model (squeezenet and mobilenetv2 need 3-channel data: cifar10)"),
    Key("udfl-mode", "unlinkable", str, choices=MODES, field="mode",
        doc="unlinkable, or baseline: non-anonymous DFL FedAvg, full models to neighbours"),
    Key("udfl-mixnet", True, bool, field="mixnet",
        doc="false: Sphinx packets go straight to the receiver (no relays, batching, cover)"),
    Key("udfl-max-hops", 2, int, ge=1, le=5, field="max_hops",
        doc="K: mix hops per packet (5 = the header's capacity)"),
    Key("udfl-outbox", 100, int, ge=1, field="outbox", doc="O: batch size of a mix node's outbox"),
    Key("udfl-mu", 0.1, float, gt=0, unit="seconds", field="mu", doc="mean per-hop delay (virtual seconds)"),
    Key("udfl-sigma", 0.001, float, ge=0, unit="seconds", field="sigma", doc="delay jitter SD (virtual seconds)"),
    Key("udfl-cover", True, bool, field="cover", doc="pad outbox batches with cover packets"),
    Key("udfl-cover-policy", "data", str, choices=COVER_POLICIES, field="cover_policy", doc="which batches are padded"),
    Key("udfl-latency", 0.005, float, ge=0, unit="seconds", field="latency",
        doc="one-way link latency (virtual seconds)"),
    Key("udfl-payload-size", 10240, int, ge=1024, unit="bytes", field="payload_size",
        doc="Sphinx body bytes (room for a SURB and a fragment)"),
    Key("udfl-share-ratio", 1.0, float, gt=0, le=1, field="share_ratio",
        doc="r: fraction of its fragments a node sends to each neighbour"),
    Key("udfl-quantize", True, bool, field="quantize",
        doc="8-bit stochastic quantization (+ zlib); false: float32 (+ zlib)"),
    Key("udfl-aggregator", "fedavg", str, choices=AGGREGATORS, field="aggregator",
        doc="fedavg (FragFedAvg) or krum (FragKrum)"),
    Key("udfl-krum-budget", 1, int, ge=0, field="krum_budget",
        doc="B_r: Byzantine fragments FragKrum tolerates per range"),
    Key("udfl-krum-fallback", "median", str, choices=KRUM_FALLBACKS, field="krum_fallback",
        doc="aggregation of a range with n_r <= 2 B_r + 2 candidates"),
    Key("udfl-topology", "circulant", str, choices=TOPOLOGIES, field="topology", doc="learning-neighbour graph"),
    Key("udfl-degree", 4, int, ge=2, field="degree",
        doc="neighbours per node (< num-clients; even for circulant; unused by full-mesh)"),
    Key("udfl-round-timeout", 120.0, float, gt=0, unit="virtual seconds", field="virtual_round_timeout",
        doc="virtual seconds the simulated network has to deliver a round's fragments (not a wall-clock wait)"),
    Key("udfl-churn-leave", 0.0, float, ge=0, lt=1, field="churn_leave",
        doc="per round, probability that a live node crashes mid-round"),
    Key("udfl-churn-join", 0.5, float, ge=0, le=1, field="churn_join",
        doc="per round, probability that a departed node rejoins"),
    Key("udfl-byzantine-fraction", 0.0, float, ge=0, lt=0.5, field="byzantine_fraction",
        doc="fraction of Byzantine nodes (chosen by seed)"),
    Key("udfl-byzantine-attack", "arbitrary", str, choices=BYZANTINE_ATTACKS, field="byzantine_attack",
        doc="arbitrary: N(0, scale^2) values; scaled: -scale x the node's state"),
    Key("udfl-byzantine-scale", 10.0, float, gt=0, field="byzantine_scale", doc="scale of the Byzantine values"),
    Key("udfl-curious-node", -1, int, ge=-1, field="curious_node",
        doc=">= 0: run the curious-recipient content-linking analysis at that node (-1 = off)"),
    Key("udfl-eval-samples", 0, int, ge=0, field="eval_samples", doc="test images per node evaluation (0 = all)"),
    SHARED_KEYS["lr"],
    SHARED_KEYS["momentum"],
    SHARED_KEYS["weight-decay"],
    SHARED_KEYS["batch-size"],
    SHARED_KEYS["local-epochs"],
    SHARED_KEYS["test-fraction"],
    SHARED_KEYS["clients-per-message"],
    SHARED_KEYS["node-local-data"],
    SHARED_KEYS["eval-data-path"],
))
