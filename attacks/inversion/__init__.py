"""Gradient inversion: DLG, iDLG and Inverting Gradients behind one registry.

Attacks see only an :class:`AdversaryView`; :mod:`attacks.inversion.metrics`
is the one place where ground truth meets a reconstruction.
"""

# Importing the attack modules registers them.
from attacks.inversion import dlg as _dlg  # noqa: F401
from attacks.inversion import invgrad as _invgrad  # noqa: F401
from attacks.inversion.labels import infer_label_from_gradient
from attacks.inversion.registry import (
    ATTACKS,
    InversionConfig,
    InversionResult,
    bounds_from_normalization,
    register_attack,
    run_attack,
)
from attacks.inversion.view import (
    AdversaryView,
    capture_single_example_gradient,
    update_from_states,
    view_from_noised_update,
)

__all__ = [
    "ATTACKS",
    "AdversaryView",
    "InversionConfig",
    "InversionResult",
    "bounds_from_normalization",
    "capture_single_example_gradient",
    "infer_label_from_gradient",
    "register_attack",
    "run_attack",
    "update_from_states",
    "view_from_noised_update",
]
