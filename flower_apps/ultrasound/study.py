"""Registration of the ultrasound study with the router."""

from __future__ import annotations

from flower_apps.config import StudySpec
from flower_apps.ultrasound import client_app, config, server_app

# Run keys this study adds to the common ones (defaults = the paper's values). The shared
# keys lr / batch-size / local-epochs / dirichlet-alpha keep dfl-dp's defaults; the
# presets set the paper's values (Adam 1e-3, batch 32, 5 local epochs, alpha 0.5).
KEYS = {
    "lr": 0.01,
    "batch-size": 128,
    "local-epochs": 1,
    "dirichlet-alpha": 0.5,
    "us-mode": "federated",  # federated | centralized | local
    "us-algorithm": "fedavg",  # fedavg | fedprox | fedadam
    "us-arch": "densenet121",  # exact timm name, see flower_apps/ultrasound/models.py
    "us-task": "normal-vs-abnormal",  # | benign-vs-malignant | three-class (| nonmalignant-vs-malignant: BreastMNIST)
    "us-partition": "non-iid",  # iid | non-iid (label+quantity+feature skew) | label | quantity | feature
    "us-image-size": 224,
    "us-quantity-sigma": 0.5,
    "us-feature-skew": 1.0,
    "us-proximal-mu": 0.01,
    "us-server-lr": 0.01,
    "us-beta1": 0.9,
    "us-beta2": 0.99,
    "us-dp-sgd": False,
    "us-noise-multiplier": 2.0,
    "us-max-grad-norm": 1.5,
    "us-delta": 1e-5,
    "us-grad-sample-mode": "ghost",  # ghost clipping + privacy/dpsgd.py's samplers: fastest on CPU, least memory
    "us-pretrained": True,
    "us-weights-dir": "",
    "us-synthetic-fallback": False,
}

SPEC = StudySpec(config.STUDY, config.ACTION, config.PRESETS, config.build_config, server_app.server_main,
                 client_app.train)
