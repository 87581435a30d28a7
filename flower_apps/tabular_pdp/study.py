"""Registration of the tabular-pdp study with the router."""

from __future__ import annotations

from flower_apps.config import StudySpec
from flower_apps.tabular_pdp import client_app, config, server_app

# Run keys this study adds to the common ones (defaults = the paper's values). Keys shared
# with dfl-dp keep dfl-dp's defaults (lr, local-epochs): the presets set the paper's values.
KEYS = {
    "lr": 0.01,
    "batch-size": 128,
    "local-epochs": 1,
    "test-fraction": 0.2,
    "delta-total": 1e-5,
    "tab-k": 5,
    "tab-suppression": 0.1,
    "tab-levels": "",
    "tab-sa-bin-width": 0.0,
    "tab-features": ",".join(config.DEFAULT_FEATURES),
    "tab-settings": "vanilla,gdp,pdp",
    "tab-noise-multiplier": 0.05,
    "tab-clip-mode": "estimate",
    "tab-clip-norm": 8.5,
    "tab-clip-quantile": 0.9,
    "tab-drift-threshold": 3.5,
    "tab-drift-min-ratio": 1.25,
    "tab-drift-recheck": 0,
    "tab-drift-exclude": True,
    "tab-poison": "none",
    "tab-poison-client": 0,
    "tab-poison-scale": 3.0,
}

SPEC = StudySpec(config.STUDY, config.ACTION, config.PRESETS, config.build_config, server_app.server_main,
                 client_app.train)
