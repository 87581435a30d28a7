"""Dirichlet partition at any N: bit-identical where the old redraw loop succeeded, guaranteed minimum elsewhere."""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import pytest

from datasets.base import DataError
from datasets.partition import (
    _hopeless,
    _repair,
    dirichlet_draw,
    dirichlet_partition,
    label_skew_tv,
    partition,
    split_by_owner,
)
from registry import streams


def old_dirichlet_partition(labels, num_clients, rng, alpha=0.5, min_size=1, max_attempts=1000, prior=None):
    """The implementation before the repair (commit 263d3db), verbatim but for the error type."""
    if num_clients * min_size > len(labels):
        raise ValueError("infeasible")
    labels = np.asarray(labels)
    classes = np.unique(labels)
    conc = alpha * (np.ones(num_clients) if prior is None else np.asarray(prior, dtype=float))
    for _ in range(max_attempts):
        buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(conc)
            cuts = (np.cumsum(q) * len(idx)).astype(int)[:-1]
            for k, part in enumerate(np.split(idx, cuts)):
                buckets[k].append(part)
        parts = [np.sort(np.concatenate(b)).astype(np.int64) for b in buckets]
        if min(len(p) for p in parts) >= min_size:
            return parts
    raise RuntimeError("old loop failed")


def labels_of(n: int, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n)


def assert_same(old: list[np.ndarray], new: list[np.ndarray]) -> None:
    assert len(old) == len(new)
    for a, b in zip(old, new, strict=True):
        assert a.dtype == b.dtype == np.int64 and np.array_equal(a, b)


def assert_partition(parts: list[np.ndarray], n: int, num_clients: int, min_size: int) -> None:
    assert len(parts) == num_clients
    assert min(len(p) for p in parts) >= min_size
    allidx = np.concatenate(parts)
    assert len(allidx) == n and np.array_equal(np.sort(allidx), np.arange(n))  # each sample exactly once
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted, as before


# --- bit-identity with the old loop --------------------------------------------------------------

# (train samples, clients, alpha): dfl-dp / attacks image plan (target-train 40,000 of MNIST or
# Fashion-MNIST, 33,333 of CIFAR-10, 3,333 of mnist-5k; N = 100, alpha 0.5), unlinkable-dfl (MNIST
# 60,000 or mnist-5k 5,000 train; N = 16 or 100, alpha 10)
STUDY_SETTINGS = [(40_000, 100, 0.5), (33_333, 100, 0.5), (3_333, 100, 0.5), (60_000, 100, 10.0),
                  (60_000, 16, 10.0), (5_000, 16, 10.0), (5_000, 100, 10.0)]


@pytest.mark.parametrize(("n", "num_clients", "alpha"), STUDY_SETTINGS)
@pytest.mark.parametrize("stream", ["datasets.partition", "datasets.shadow-partition"])
def test_bit_identical_on_study_settings(n, num_clients, alpha, stream):
    y = labels_of(n, seed=n)
    for seed in range(3):
        ref_rng, rng = streams.rng(stream, seed), streams.rng(stream, seed)
        assert_same(old_dirichlet_partition(y, num_clients, ref_rng, alpha=alpha, min_size=1),
                    dirichlet_partition(y, num_clients, rng, alpha=alpha, min_size=1))
        assert ref_rng.bit_generator.state == rng.bit_generator.state  # same calls on the stream


# settings where the old loop needs several to hundreds of draws (mean short clients per draw 0.3-6),
# with min_size > 1 and a prior: the accepted draw, not just the first, must be the same
@pytest.mark.parametrize(("n", "num_clients", "alpha", "min_size", "prior"), [
    (1_500, 200, 0.5, 1, None), (2_000, 300, 0.5, 1, None), (3_000, 200, 0.5, 3, None),
    (500, 50, 0.3, 2, None), (2_000, 200, 1.0, 2, "ramp"), (40, 2, 0.05, 5, None)])
def test_bit_identical_where_the_old_loop_redraws(n, num_clients, alpha, min_size, prior):
    y = labels_of(n, classes=5, seed=1)
    pri = np.linspace(0.5, 1.5, num_clients) if prior == "ramp" else None
    class_idx = [np.flatnonzero(y == c) for c in np.unique(y)]
    conc = alpha * (np.ones(num_clients) if pri is None else pri)
    served = later = 0
    for seed in range(8):
        try:
            ref = old_dirichlet_partition(y, num_clients, np.random.default_rng(seed), alpha, min_size, prior=pri)
        except RuntimeError:
            continue
        served += 1
        new = dirichlet_partition(y, num_clients, np.random.default_rng(seed), alpha, min_size, prior=pri)
        assert_same(ref, new)
        first = split_by_owner(dirichlet_draw(class_idx, conc, np.random.default_rng(seed)).owners(n), num_clients)
        later += any(not np.array_equal(a, b) for a, b in zip(first, new, strict=True))
    assert served >= 4 and later >= 1  # some seeds were served by a later draw, not the first


def test_old_failure_becomes_a_partition_and_the_old_successes_stay():
    # max_attempts=3: the old loop fails on some seeds; those get a repaired partition, the others the same one
    y = labels_of(1_500, classes=5, seed=2)  # ~2 short clients per draw: 8% of draws serve
    outcomes = set()
    for seed in range(16):
        new = dirichlet_partition(y, 200, np.random.default_rng(seed), alpha=0.5, max_attempts=3)
        assert_partition(new, 1_500, 200, 1)
        try:
            assert_same(old_dirichlet_partition(y, 200, np.random.default_rng(seed), 0.5, max_attempts=3), new)
            outcomes.add("same")
        except RuntimeError:
            outcomes.add("repaired")
    assert outcomes == {"same", "repaired"}


# --- guarantees at any N ------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [0.1, 0.5, 1.0])
@pytest.mark.parametrize(("num_clients", "n"), [(2, 50), (10_000, 40_000), (100_000, 500_000)])
def test_every_client_served_every_sample_once_deterministic(num_clients, n, alpha):
    y = labels_of(n, seed=3)
    a = partition("dirichlet", y, num_clients, seed=5, alpha=alpha)
    assert_partition(a, n, num_clients, 1)
    assert_same(a, partition("dirichlet", y, num_clients, seed=5, alpha=alpha))
    b = partition("dirichlet", y, num_clients, seed=6, alpha=alpha)
    assert any(not np.array_equal(x, z) for x, z in zip(a, b, strict=True))


def test_two_clients_forced_repair_and_tight_minimum():
    # n = N * min_size: only the exact 5/5 split serves; at alpha 0.01 one draw almost never gives it
    y = labels_of(10, classes=2, seed=4)
    parts = dirichlet_partition(y, 2, np.random.default_rng(0), alpha=0.01, min_size=5, max_attempts=1)
    assert [len(p) for p in parts] == [5, 5]
    assert_partition(parts, 10, 2, 5)


def test_the_issue_setting_is_fast_and_stops_at_the_first_draw(caplog):
    # issue 40: alpha 0.5, 10,000 clients, ~40,000 samples: the old loop spends its 1000 draws and fails
    y = labels_of(40_000, seed=7)
    with caplog.at_level(logging.WARNING, logger="datasets.partition"):
        t = time.perf_counter()
        parts = dirichlet_partition(y, 10_000, np.random.default_rng(0), alpha=0.5)
        seconds = time.perf_counter() - t
    assert_partition(parts, 40_000, 10_000, 1)
    assert "1 draws left clients" in caplog.text and "repaired the last" in caplog.text
    assert seconds < 10  # measured ~0.05 s; the old loop ~0.1-0.5 s per draw, 1000 draws


def test_repaired_partition_is_the_repair_of_the_last_draw():
    y = labels_of(40_000, seed=8)
    rng = np.random.default_rng(3)
    class_idx = [np.flatnonzero(y == c) for c in np.unique(y)]
    draw = dirichlet_draw(class_idx, 0.5 * np.ones(10_000), rng)  # hopeless at the first draw (above)
    owner = draw.owners(len(y))
    filled, moved = _repair(draw, owner, 1)
    assert filled == moved == int((draw.counts.sum(1) == 0).sum()) > 50
    assert_same(split_by_owner(owner, 10_000), dirichlet_partition(y, 10_000, np.random.default_rng(3), alpha=0.5))


# --- the error case -----------------------------------------------------------------------------

def test_infeasible_minimum_is_a_data_error_before_any_draw():
    y = labels_of(100, seed=9)
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    with pytest.raises(DataError, match=r"cannot give 26 clients >= 4 samples each from 100"):
        dirichlet_partition(y, 26, rng, alpha=0.5, min_size=4)
    assert rng.bit_generator.state == state  # refused before any work
    with pytest.raises(DataError, match="larger than the number of samples"):
        partition("dirichlet", y, 101, seed=0)
    with pytest.raises(ValueError, match="max_attempts"):
        dirichlet_partition(y, 2, rng, max_attempts=0)
    assert_partition(dirichlet_partition(y, 25, rng, alpha=0.1, min_size=4), 100, 25, 4)  # N * m == n is served


# --- the early-stop rule ------------------------------------------------------------------------

def test_hopeless_rule_line():
    assert not _hopeless(83, 1, 999) and _hopeless(84, 1, 999)  # the documented line
    assert not _hopeless(484, 10, 990) and _hopeless(485, 10, 990)
    assert not _hopeless(20 * 500, 500, 500)  # 20 short per draw: e^-20 per draw is not hopeless enough
    assert not _hopeless(0, 5, 995) and _hopeless(0, 1000, 0)


def test_short_count_is_about_poisson_so_exp_minus_mean_bounds_success():
    # the rule's model: P(no client short) <= exp(-E[short]); checked where success is common enough to count
    y = labels_of(2_000, seed=10)
    class_idx = [np.flatnonzero(y == c) for c in np.unique(y)]
    rng = np.random.default_rng(11)
    shorts = np.array([(dirichlet_draw(class_idx, 0.5 * np.ones(300), rng).counts.sum(1) < 1).sum()
                       for _ in range(400)])
    p0, mean = float(np.mean(shorts == 0)), float(shorts.mean())
    assert 0.3 < mean < 3
    assert p0 <= math.exp(-mean) + 3 * math.sqrt(math.exp(-mean) / 400)  # within 3 s.e. of the bound
    assert 0.6 < shorts.var() / mean < 1.5


# --- skew preserved -----------------------------------------------------------------------------

def random_fill(draw, owner: np.ndarray, min_size: int, rng: np.random.Generator) -> np.ndarray:
    """A broken repair, for the check to fire on: fill short clients with random donors' random samples."""
    owner = owner.copy()
    size = np.bincount(owner, minlength=draw.counts.shape[0])
    short = [k for k in np.flatnonzero(size < min_size) for _ in range(min_size - size[k])]
    for i in rng.permutation(len(owner)):
        if not short:
            break
        if size[owner[i]] > min_size:
            size[owner[i]] -= 1
            owner[i] = short.pop()
    return owner


@pytest.mark.parametrize("alpha", [0.1, 0.5, 1.0])
def test_repair_preserves_label_skew(alpha):
    # min_size 5 so that a filled client's labels can show which classes it got (one sample always looks skewed)
    y = labels_of(100_000, seed=12)
    class_idx = [np.flatnonzero(y == c) for c in np.unique(y)]
    draw = dirichlet_draw(class_idx, alpha * np.ones(10_000), np.random.default_rng(13))
    before = draw.owners(len(y))
    sizes = draw.counts.sum(1)
    recipients, donors = np.flatnonzero(sizes < 5), np.flatnonzero(sizes > 5)
    ours = before.copy()
    _repair(draw, ours, 5)
    broken = random_fill(draw, before, 5, np.random.default_rng(0))

    def tv(owner, which=None):
        parts = split_by_owner(owner, 10_000)
        return float(label_skew_tv(y, parts if which is None else [parts[k] for k in which], 10).mean())

    assert abs(tv(ours) - tv(before)) < 0.01  # mean TV from the label distribution over all clients
    assert abs(tv(ours, donors) - tv(before, donors)) < 0.01  # donors barely change
    for after in (ours, broken):
        assert_partition(split_by_owner(after, 10_000), len(y), 10_000, 5)
    # filled clients get their own top classes: far more skewed than random filling (the check fires on it)
    assert tv(ours, recipients) > tv(broken, recipients) + 0.05
    parts = split_by_owner(ours, 10_000)
    top = np.argmax(draw.weights, axis=1)
    got_top = [np.mean(y[np.setdiff1d(parts[k], np.flatnonzero(before == k))] == top[k]) for k in recipients[:500]]
    assert np.mean(got_top) > 0.9  # the added samples are of the class the draw weighted highest
