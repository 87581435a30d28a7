"""Empirical privacy audits: measured epsilon beside the formal one (issue 13).

The package sees only what an auditor may see: released models, the canaries it made and which of
them it inserted; never the DP noise. See docs/audit.md.

- ``stats``: Clopper-Pearson lower bound at a stated confidence, Andrew et al.'s Gaussian point
  estimate, exact epsilon of a mu-GDP mechanism / of a pair of Gaussians.
- ``canaries``: canary clients (random isotropic updates at the clip norm, half inserted).
- ``client_level``: canary cosines on the released models, both threat models (every round's
  model, or the final model only), per canary group; each release's projections on the canaries.
- ``verdict``: the audit's verdict (consistent / violation / underpowered) from tests whose
  references come from the configuration, not from the mechanism (issue 37).
"""

from privacy.audit.canaries import STREAM_AUDIT_CANARIES, CanarySet, auditor_generator, make_canaries
from privacy.audit.client_level import (
    THREAT_MODELS,
    ReleaseObserver,
    canary_cosines,
    canary_projections,
    estimate,
    flat_params,
    formal_add_remove_epsilon,
    split_like,
)
from privacy.audit.stats import (
    clopper_pearson,
    epsilon_lower_bound,
    gaussian_pair_epsilon,
    gdp_epsilon,
    max_certifiable_epsilon,
    point_estimate,
)

# Example-level audit (DP-SGD, Steinke-Nasr-Jagielski one-run): privacy.audit.example_level, added by its owner.

__all__ = [
    "STREAM_AUDIT_CANARIES", "CanarySet", "auditor_generator", "make_canaries",
    "THREAT_MODELS", "ReleaseObserver", "canary_cosines", "canary_projections", "estimate", "flat_params",
    "formal_add_remove_epsilon",
    "split_like",
    "clopper_pearson", "epsilon_lower_bound", "gaussian_pair_epsilon", "gdp_epsilon", "max_certifiable_epsilon",
    "point_estimate",
]
