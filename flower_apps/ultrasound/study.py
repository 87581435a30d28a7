"""The ultrasound study: its name, ClientApp action and run keys (defaults = the paper's values).

The shared keys lr / batch-size / local-epochs / dirichlet-alpha keep dfl-dp's defaults; the
presets set the paper's values (Adam 1e-3, batch 32, 5 local epochs, alpha 0.5). Imports nothing
else of this package but its model registry: config.py reads ``KEYS`` from here.
"""

from __future__ import annotations

from datasets.busi import TASKS, ULTRASOUND_SOURCES
from flower_apps.config import COMMON_KEYS, SHARED_KEYS, Key, KeyTable
from flower_apps.ultrasound.models import ARCHS, DP_FINETUNE, HEAD_INITS
from privacy.dpsgd import GRAD_SAMPLE_MODES
from privacy.randomness import NOISE_MODES

STUDY = "ultrasound"
ACTION = "ultrasound"
ALGORITHMS = ("fedavg", "fedprox", "fedadam")
MODES = ("federated", "centralized", "local")
PARTITIONS = ("iid", "non-iid", "label", "quantity", "feature")
# the one-run DP-SGD audit's canaries (flower_apps/ultrasound/audit.py): input-space examples, or white-box
# gradient canaries inside client 0's DP-SGD optimizer (issue 37: the kind with power, and a verdict)
CANARY_KINDS = ("random-pixels", "mislabelled", "gradient")

# Where a training node finds its own DP-SGD seed file (us-noise-mode='seeded'): its SuperNode's
# --node-config key, else this variable in its own environment (simulations: one node config for all).
NODE_SEED_KEY = "noise-seed-file"
NOISE_SEED_ENV = "PPFL_NOISE_SEED_FILE"


def _no_seed_file_in_run_config(path: str) -> str:
    """Ultrasound's DP noise is each client's (DP-SGD): the coordinator's run config may not name its seed."""
    if path:
        raise ValueError(
            f"got {path!r}; ultrasound's DP-SGD noise is added by each client, and the run config (the "
            "coordinator's) never names a client's seed file: set us-noise-mode='seeded' and give each "
            f"SuperNode its own file (--node-config \"{NODE_SEED_KEY}='/path'\"; in a simulation, "
            f"{NOISE_SEED_ENV}=/path in the clients' environment)")
    return path



def _null_unless_method(method: str) -> dict[str, tuple[str, ...]]:
    """``hash_null_when`` of a knob only ``method`` (a federated algorithm) reads: null in every other run."""
    return {"us-mode": tuple(m for m in MODES if m != "federated"),
            "us-algorithm": tuple(a for a in ALGORITHMS if a != method)}


_NULL_WITHOUT_DP_SGD = {"us-dp-sgd": (False,)}  # DP knobs are hashed as null in runs without DP-SGD
# simulated runs keep the hashes they had before deployments existed
_OMIT_WHEN_SIMULATED = {"node-local-data": (False,)}

# The run identity (flower_apps/common/results.py:run_identity) as ultrasound's kept runs carry it: never the
# device, the per-sample-gradient implementation or the memory layout (same mathematics, other speed and
# last-bit rounding); keys added later (head init, noise mode, audit, node-local data) out at their old value.
KEYS = KeyTable(STUDY, (
    COMMON_KEYS["dataset"].refine(choices=ULTRASOUND_SOURCES),
    COMMON_KEYS["device"].refine(in_run_hash=False),
    COMMON_KEYS["noise-seed-file"].refine(parse=_no_seed_file_in_run_config,
                                          allowed="'' (a client's seed file is its node's: us-noise-mode)"),
    # synthetic images are generated (datasets/busi.py): they read no files
    COMMON_KEYS["data-dir"].refine(unused_when={"dataset": ("synthetic",)}),
    SHARED_KEYS["lr"],
    SHARED_KEYS["batch-size"],
    SHARED_KEYS["local-epochs"],
    SHARED_KEYS["dp-fault"],
    SHARED_KEYS["dirichlet-alpha"],
    Key("us-mode", "federated", str, choices=MODES, field="mode",
        doc="federated, or a baseline: centralized (pooled data) or local (each client alone)"),
    Key("us-algorithm", "fedavg", str, choices=ALGORITHMS, field="algorithm", doc="federated algorithm"),
    Key("us-arch", "densenet121", str, choices=ARCHS, field="arch",
        doc="backbone: exact timm name (flower_apps/ultrasound/models.py)"),
    Key("us-task", "normal-vs-abnormal", str, choices=TASKS, field="task",
        doc="classification task (nonmalignant-vs-malignant: BreastMNIST's)"),
    Key("us-partition", "non-iid", str, choices=PARTITIONS, field="partition",
        doc="client split: iid, non-iid (label + quantity + feature skew) or one skew alone"),
    Key("us-image-size", 224, int, ge=8, field="image_size",
        doc="input side in pixels (the backbone may need a multiple)"),
    Key("us-quantity-sigma", 0.5, float, ge=0, field="quantity_sigma", doc="lognormal sigma of the client-size skew"),
    Key("us-feature-skew", 1.0, float, ge=0, field="feature_skew",
        doc="strength of the per-client image transform skew"),
    Key("us-proximal-mu", 0.01, float, ge=0, field="proximal_mu", hash_null_when=_null_unless_method("fedprox"),
        doc="FedProx proximal term mu"),
    Key("us-server-lr", 0.01, float, gt=0, field="server_lr", hash_null_when=_null_unless_method("fedadam"),
        doc="FedAdam server learning rate"),
    Key("us-beta1", 0.9, float, ge=0, lt=1, field="beta1", hash_null_when=_null_unless_method("fedadam"),
        doc="FedAdam beta1"),
    Key("us-beta2", 0.99, float, ge=0, lt=1, field="beta2", hash_null_when=_null_unless_method("fedadam"),
        doc="FedAdam beta2"),
    Key("us-dp-sgd", False, bool, field="dp_sgd", doc="train the clients with DP-SGD (Opacus)"),
    Key("us-noise-multiplier", 2.0, float, ge=0, field="noise_multiplier", hash_null_when=_NULL_WITHOUT_DP_SGD,
        doc="z: DP-SGD noise multiplier"),
    Key("us-max-grad-norm", 1.5, float, gt=0, field="max_grad_norm", hash_null_when=_NULL_WITHOUT_DP_SGD,
        doc="C: DP-SGD per-sample clipping norm"),
    Key("us-delta", 1e-5, float, gt=0, lt=1, field="delta", hash_null_when=_NULL_WITHOUT_DP_SGD,
        doc="delta at which DP-SGD epsilon is reported"),
    # secure runs (and runs without DP-SGD) keep the hash they had before the key existed
    Key("us-noise-mode", "secure", str, choices=NOISE_MODES, field="noise_mode", roles={"randomness"},
        hash_omit_when={"us-dp-sgd": (False,), "us-noise-mode": ("secure",)},
        doc=f"DP-SGD noise randomness of each training node: secure (OS entropy) or seeded (the node's own seed "
            f"file: its --node-config {NODE_SEED_KEY}, else ${NOISE_SEED_ENV}; a node without one refuses; "
            "the run config never names it)"),
    Key("us-dp-finetune", "frozen-bn", str, choices=DP_FINETUNE, field="dp_finetune",
        hash_null_when=_NULL_WITHOUT_DP_SGD,
        doc="DP-SGD on a pretrained net: frozen-bn (BatchNorm frozen in eval form, ImageNet statistics kept), "
            "frozen-bn-last (also only the last 3 layer groups trained), frozen-bn-head (only the classifier "
            "trained: a DP linear probe) or groupnorm (BN -> GroupNorm)"),
    Key("us-grad-sample-mode", "ghost", str, choices=GRAD_SAMPLE_MODES, field="grad_sample_mode",
        roles={"transport"}, in_run_hash=False,
        doc="per-sample gradient implementation (ghost clipping: fastest on CPU, least memory)"),
    Key("us-channels-last", False, bool, field="channels_last", roles={"transport"}, in_run_hash=False,
        doc="train in channels-last memory layout (same mathematics, other summation order: 1.3-1.6x faster "
            "on CPUs with oneDNN, e.g. EfficientNet-Lite0 at 160 px; not part of the run's identity); non-DP "
            "training only: DP-SGD keeps the default layout (Opacus' per-sample conv gradients are wrong in "
            "channels-last)"),
    Key("us-pretrained", True, bool, field="pretrained", doc="start from ImageNet weights when available"),
    # runs with timm's head keep the hash they had before the key existed
    Key("us-head-init", "timm", str, choices=HEAD_INITS, field="head_init", hash_omit_when={"us-head-init": ("timm",)},
        doc="the new classifier head: timm's initialisation, or zero (the usual start for a linear probe and "
            "for DP fine-tuning: no random logits before the first update)"),
    Key("us-weights-dir", "", str, field="weights_dir", doc="where pretrained weights are ('' = the caches)"),
    Key("us-synthetic-fallback", False, bool, field="synthetic_fallback",
        doc="smoke only: labelled synthetic images when BUSI is absent"),
    SHARED_KEYS["node-local-data"].refine(hash_omit_when=_OMIT_WHEN_SIMULATED),
    SHARED_KEYS["eval-data-path"].refine(hash_omit_when=_OMIT_WHEN_SIMULATED),
    # un-audited runs keep the hash they had before the audit keys existed
    Key("us-audit-canaries", 0, int, ge=0, field="audit_canaries", roles={"probe"},
        hash_omit_when={"us-audit-canaries": (0,)},
        doc="one-run empirical DP-SGD audit of client 0 (federated runs): canary examples, half inserted; "
            "0 = no audit (docs/audit.md)"),
    Key("us-audit-canary", "random-pixels", str, choices=CANARY_KINDS, field="audit_canary", roles={"probe"},
        hash_omit_when={"us-audit-canaries": (0,)},
        doc="audit canaries: random-pixel images with random labels, mislabelled images of client 0, or gradient "
            "(white-box Dirac gradient canaries of norm C in client 0's DP-SGD steps, noise measured against the "
            "configured z C; needs us-dp-sgd=true)"),
))
