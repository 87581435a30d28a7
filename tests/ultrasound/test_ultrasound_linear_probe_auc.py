"""The linear probe's score tells informative features from uninformative ones (no BUSI, no weights needed)."""

import numpy as np

from flower_apps.ultrasound.pretrained import linear_probe_auc


def test_probe_auc_separates_informative_from_random_features():
    rng = np.random.default_rng(0)
    labels = np.r_[np.zeros(60, int), np.ones(60, int)]
    noise = rng.normal(size=(120, 32))
    informative = noise + 1.5 * labels[:, None] * (np.arange(32) < 4)  # four coordinates carry the label
    assert linear_probe_auc(informative, labels) > 0.9
    assert abs(linear_probe_auc(noise, labels) - 0.5) < 0.15
