"""The dfl-dp study: its name, ClientApp action and run keys (defaults = the paper's values).

Imports nothing else of this package: config.py reads ``KEYS`` from here (see flower_apps.studies).
"""

from __future__ import annotations

from datasets.registry import DATASETS
from flower_apps.config import COMMON_KEYS, SHARED_KEYS, Key, KeyTable
from privacy.sampling import SCHEMES as SAMPLING_SCHEMES

STUDY = "dfl-dp"
ACTION = "dfl_dp"

KEYS = KeyTable(STUDY, (
    COMMON_KEYS["num-clients"].refine(ge=2),
    COMMON_KEYS["dataset"].refine(choices=DATASETS),
    # mnist-5k is the built-in offline subset (datasets/registry.py): it reads no files
    COMMON_KEYS["data-dir"].refine(unused_when={"dataset": ("mnist-5k",)}),
    # the frameworks client_app.train plays (strategies.registry holds others, e.g. fedavg-examples)
    Key("framework", "fl", str, choices=("fl", "sequential-dfl"), doc="fl (FedAvg) or sequential-dfl (token passing)"),
    Key("dp", True, bool, doc="add the matched Gaussian perturbation (false: no clipping, no noise)"),
    Key("clip-norm", 1.0, float, gt=0, doc="C: L2 clipping norm of each update"),
    Key("eps-cal", 2.0, float, gt=0, doc="epsilon used to calibrate sigma_abs"),
    Key("delta-cal", 1e-5, float, gt=0, lt=1, doc="delta used to calibrate sigma_abs"),
    SHARED_KEYS["delta-total"],
    SHARED_KEYS["dirichlet-alpha"],
    SHARED_KEYS["lr"],
    SHARED_KEYS["momentum"],
    SHARED_KEYS["weight-decay"],
    SHARED_KEYS["batch-size"],
    SHARED_KEYS["local-epochs"],
    Key("grad-clip", 10.0, float, gt=0, doc="max gradient norm in local SGD (stability, every condition; not DP)"),
    # Client sampling (issue 40, privacy/sampling.py): the server's secret per-round draw. Kept runs predate the
    # keys: at full participation both stay out of the run hash, so those runs keep their identity.
    Key("client-fraction", 1.0, float, gt=0, le=1, hash_omit_when={"client-fraction": (1.0,)},
        doc="q: fraction of clients the server samples each round (1 = full participation, the seed paper's)"),
    Key("client-sampling", "poisson", str, choices=SAMPLING_SCHEMES, unused_when={"client-fraction": (1.0,)},
        hash_omit_when={"client-fraction": (1.0,)},
        doc="poisson (each client with probability q; DP-FedAvg's fixed denominator q N) or fixed "
            "(round(q N) clients uniformly without replacement)"),
    SHARED_KEYS["clients-per-message"],
    SHARED_KEYS["test-fraction"],
    SHARED_KEYS["node-local-data"],
    SHARED_KEYS["eval-data-path"],
    SHARED_KEYS["dp-fault"],
    Key("data-part", "target", str, choices=("target", "shadow"), roles=frozenset({"probe"}),
        doc="clients hold target-train, or shadow-train (membership-inference shadow runs)"),
    Key("capture-victims", 0, int, ge=0, roles=frozenset({"probe"}),
        doc="clients whose models and gradients are saved for the attacks (<= num-clients)"),
    Key("attack-round", 0, int, ge=0, doc="round captured for the attacks (0 = the last; <= num-rounds)"),
    Key("audit-canaries", 0, int, ge=0, roles=frozenset({"probe"}),
        doc="empirical privacy audit: canary clients (even; half inserted), 0 = no audit (docs/audit.md)"),
))
