"""Registration of the dfl-dp study with the router."""

from __future__ import annotations

from flower_apps.config import StudySpec
from flower_apps.dfl_dp import client_app, config, server_app

# Run keys this study adds to the common ones (defaults = the paper's values).
KEYS = {
    "framework": "fl",
    "dp": True,
    "clip-norm": 1.0,
    "eps-cal": 2.0,
    "delta-cal": 1e-5,
    "delta-total": 1e-5,
    "dirichlet-alpha": 0.5,
    "lr": 0.01,
    "momentum": 0.9,
    "weight-decay": 5e-4,
    "batch-size": 128,
    "local-epochs": 1,
    "grad-clip": 10.0,
    "clients-per-message": 1,
    "test-fraction": 0.2,
    "data-part": "target",
    "capture-victims": 0,
    "attack-round": 0,
}

SPEC = StudySpec(config.STUDY, config.ACTION, config.PRESETS, config.build_config, server_app.server_main,
                 client_app.train)
