"""Client sampling (privacy/sampling.py): the cohort draws, their distribution, and where their randomness comes from."""

import numpy as np
import pytest
from scipy import stats

from privacy.randomness import NoiseSource
from privacy.sampling import (
    RELATION,
    STREAM_CLIENT_SAMPLING,
    CohortSampler,
    expected_cohort,
    fixed_cohort_size,
    fixed_size_cohort,
    poisson_cohort,
)


def test_fixed_cohort_size_rounds_half_up_and_refuses_zero():
    assert fixed_cohort_size(0.25, 10) == 3  # 2.5 -> 3 (half up, not Python's half-to-even 2)
    assert fixed_cohort_size(0.3, 10) == 3
    assert fixed_cohort_size(1.0, 7) == 7
    assert fixed_cohort_size(0.05, 10) == 1  # 0.5 -> 1
    with pytest.raises(ValueError, match="rounds to 0 clients"):
        fixed_cohort_size(0.04, 10)
    for bad in (0.0, -0.1, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"in \(0, 1\]"):
            fixed_cohort_size(bad, 10)


def test_expected_cohort_is_qn_or_the_fixed_size_and_n_at_full_participation():
    assert expected_cohort("poisson", 0.3, 10) == pytest.approx(3.0)
    assert expected_cohort("poisson", 0.05, 10) == pytest.approx(0.5)  # may be < 1: the fixed denominator
    assert expected_cohort("fixed", 0.25, 10) == 3.0
    assert expected_cohort("poisson", 1.0, 10) == expected_cohort("fixed", 1.0, 10) == 10.0
    with pytest.raises(ValueError, match="sampling scheme"):
        expected_cohort("bernoulli", 0.5, 10)
    assert RELATION == {"poisson": "add-remove", "fixed": "replace-one"}


def test_fixed_size_cohort_has_the_size_and_is_uniform():
    rng = np.random.default_rng(0)
    draws = [fixed_size_cohort(10, 3, rng) for _ in range(6000)]
    assert all(d.size == 3 and len(set(d.tolist())) == 3 and np.all(np.diff(d) > 0) for d in draws)
    counts = np.bincount(np.concatenate(draws), minlength=10)  # each client in 3/10 of the rounds
    assert stats.chisquare(counts).pvalue > 1e-3
    with pytest.raises(ValueError, match="cohort size"):
        fixed_size_cohort(10, 0, rng)


def test_poisson_cohort_includes_each_client_independently_with_probability_q():
    rng = np.random.default_rng(1)
    q, n, rounds = 0.2, 12, 5000
    draws = [poisson_cohort(n, q, rng) for _ in range(rounds)]
    sizes = np.array([d.size for d in draws])
    # the size is Binomial(n, q): its mean and variance, and the empty cohort's frequency (1 - q)^n
    assert abs(sizes.mean() - n * q) < 4 * np.sqrt(n * q * (1 - q) / rounds)
    assert sizes.var() == pytest.approx(n * q * (1 - q), rel=0.1)
    assert np.mean(sizes == 0) == pytest.approx((1 - q) ** n, abs=0.02)
    counts = np.bincount(np.concatenate(draws), minlength=n)
    assert stats.chisquare(counts).pvalue > 1e-3  # every client equally often
    pair = np.mean([(0 in d) and (1 in d) for d in draws])  # independence: P(0 and 1) = q^2
    assert pair == pytest.approx(q * q, abs=0.015)


def test_the_sampler_draws_each_round_once_in_order_and_splits_clients_from_extra_members():
    s = CohortSampler("fixed", 0.5, 6, np.random.default_rng(3), num_extra=4)
    assert s.population == 10 and s.cohort_size == 5.0 and s.relation == "replace-one"
    first = s.members(1).copy()
    assert first.size == 5 and np.array_equal(s.members(1), first)  # asked again: the same draw
    assert np.array_equal(np.sort(np.concatenate([s.clients(1), s.extras(1) + 6])), first)
    assert np.all(s.clients(1) < 6) and np.all((s.extras(1) >= 0) & (s.extras(1) < 4))
    s.members(2)
    with pytest.raises(ValueError, match="round order"):
        s.members(0)
    assert s.describe() == {"client_sampling": "fixed", "client_fraction": 0.5, "sampling_population": 10,
                            "sampling_cohort": 5.0, "sampling_relation": "replace-one"}
    with pytest.raises(ValueError, match="client fraction"):
        CohortSampler("poisson", 0.0, 6, np.random.default_rng(0))


def test_the_cohort_is_repeatable_only_from_the_servers_seed_file_never_from_the_run_seed(tmp_path):
    """Seeded: same file and seed, same cohorts. Secure (default): the run seed alone (which every message
    carries) does not determine the draw."""
    secret = tmp_path / "server.seed"
    secret.write_text("the server's own secret")

    def cohorts(noise: NoiseSource, seed: int = 0) -> list[list[int]]:
        s = CohortSampler("poisson", 0.3, 50, noise.numpy_generator(STREAM_CLIENT_SAMPLING, seed))
        return [s.clients(r).tolist() for r in range(1, 6)]

    a, b = cohorts(NoiseSource(str(secret), "cond")), cohorts(NoiseSource(str(secret), "cond"))
    assert a == b
    assert cohorts(NoiseSource(str(secret), "cond"), seed=1) != a  # another run seed, another stream
    assert cohorts(NoiseSource(str(secret), "other condition")) != a
    assert cohorts(NoiseSource()) != cohorts(NoiseSource())  # OS entropy: nobody can repeat it
    # the draw is not the DP noise's stream either
    noise_rng = NoiseSource(str(secret), "cond").numpy_generator(STREAM_CLIENT_SAMPLING + 1, 0)
    assert [np.flatnonzero(noise_rng.random(50) < 0.3).tolist() for _ in range(5)] != a
