"""privacy.clip_estimate: the clip-norm quantile no single reply controls, and finite C only."""

import math

import numpy as np
import pytest

from privacy.clip_estimate import check_clip_norm, robust_quantile


def test_one_huge_norm_among_nine_honest_does_not_set_c():
    honest = list(np.linspace(0.9, 1.1, 9))
    # the plain interpolated quantile is about 1e5 here (the finding in issue 36)
    assert np.quantile(honest + [1e6], 0.9) > 1e4
    assert min(honest) <= robust_quantile(honest + [1e6], 0.9) <= max(honest)


@pytest.mark.parametrize("q", [0.5, 0.9, 1.0])
def test_any_single_hostile_value_stays_between_honest_values(q):
    rng = np.random.default_rng(0)
    honest = rng.uniform(0.5, 2.0, size=9)
    for hostile in (0.0, 1e-9, 1e3, 1e300):
        est = robust_quantile(list(honest) + [hostile], q)
        assert honest.min() <= est <= honest.max()


def test_refuses_what_it_cannot_estimate():
    with pytest.raises(ValueError, match="at least 3"):
        robust_quantile([1.0, 2.0], 0.9)
    with pytest.raises(ValueError, match="finite"):
        robust_quantile([1.0, 2.0, math.inf], 0.9)
    with pytest.raises(ValueError, match="finite and > 0"):
        check_clip_norm(math.inf, "test")
