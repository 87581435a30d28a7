"""Client-side DP-SGD with Opacus, one module per job.

* :mod:`~privacy.dpsgd.compat` -- making timm models Opacus-compatible (each change reported).
* :mod:`~privacy.dpsgd.opacus_adapter`, :mod:`~privacy.dpsgd.timm_adapter` -- every Opacus / timm internal
  this package relies on, version-gated (registry.third_party), with what each is for.
* :mod:`~privacy.dpsgd.samplers` -- fast per-sample gradient / norm samplers (depthwise and 1x1
  convs, timm ``GroupNormAct``, the ViT token leaf), as plain functions and read-only tables.
* :mod:`~privacy.dpsgd.grad_sample` -- GradSampleModule subclasses that use those samplers for the
  model they wrap, and only for it.
* :mod:`~privacy.dpsgd.book_keeping` -- ghost clipping's clipped gradient sum from its one backward pass.
* :mod:`~privacy.dpsgd.engine` -- :func:`make_private` (the wiring), ghost clipping, the copy-free DP optimizer.
* :mod:`~privacy.dpsgd.canaries` -- an auditor's white-box gradient canaries inside the DP optimizer's step.
* :mod:`~privacy.dpsgd.ledger` -- recording DP-SGD steps; epsilon from dp-accounting (its absl warnings kept quiet).
* :mod:`~privacy.dpsgd.calibrate` -- the Poisson sample rate; the noise multiplier for a target epsilon.
* :mod:`~privacy.dpsgd.loop` -- a DP-SGD training loop for any model and input shape (empty batches take noisy steps).

Importing this package changes nothing in Opacus: no sampler is registered with Opacus and none of
its functions is replaced (tests/privacy/test_privacy_dpsgd_scoping.py). A model gets the fast
samplers when it is made private by :func:`make_private` (``fast_samplers=True``, the default).
"""

from privacy.opacus_import import import_opacus

import_opacus()  # before any opacus import: no root log handler (see privacy/opacus_import.py)

# ruff: noqa: E402  (the imports below must follow import_opacus())
from privacy.dpsgd.calibrate import ACCOUNTANTS, NoiseCalibration, noise_multiplier_for_epsilon, sample_rate
from privacy.dpsgd.canaries import GradientCanaries, with_gradient_canaries
from privacy.dpsgd.compat import (
    BN_MODES,
    ModelChange,
    PrefixTokenPosEmbed,
    freeze_batchnorm,
    make_opacus_compatible,
    replace_batchnorm_act,
    train_last_groups,
)
from privacy.dpsgd.engine import (
    GRAD_SAMPLE_MODES,
    PrivateTraining,
    ghost_clipping_backward,
    ghost_targets,
    make_private,
    unwrap,
)
from privacy.dpsgd.grad_sample import (
    FastGhostClippingModule,
    FastGradSampleModule,
    grad_sample_module,
    store_grad_sample,
)
from privacy.dpsgd.ledger import DpSgdEvent, DpSgdLedger, dp_event, paper_sqrt_t_bound, quiet_absl, rdp_epsilon
from privacy.dpsgd.loop import LOOP_GRAD_SAMPLE_MODES, DpSgdResult, DpSgdStats, train_dp_sgd
from privacy.dpsgd.samplers import FAST_GRAD_SAMPLERS, FAST_NORM_SAMPLERS

__all__ = [
    "ACCOUNTANTS", "BN_MODES", "DpSgdEvent", "DpSgdLedger", "DpSgdResult", "DpSgdStats",
    "FAST_GRAD_SAMPLERS", "FAST_NORM_SAMPLERS", "FastGhostClippingModule", "FastGradSampleModule", "GRAD_SAMPLE_MODES",
    "GradientCanaries", "LOOP_GRAD_SAMPLE_MODES", "ModelChange", "NoiseCalibration", "PrefixTokenPosEmbed",
    "PrivateTraining", "dp_event", "freeze_batchnorm", "ghost_clipping_backward", "ghost_targets", "grad_sample_module",
    "make_opacus_compatible", "make_private", "noise_multiplier_for_epsilon", "paper_sqrt_t_bound", "quiet_absl",
    "rdp_epsilon", "replace_batchnorm_act", "sample_rate", "store_grad_sample", "train_dp_sgd", "train_last_groups",
    "unwrap", "with_gradient_canaries",
]
