import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datasets.partition import PARTITIONERS, class_counts, dirichlet_partition, partition
from datasets.splits import FOUR_WAY_SIZES, four_way_split, stratified_holdout, stratified_split, subsample_stratified


def test_four_way_split_paper_sizes_disjoint_stratified():
    y = np.random.default_rng(0).integers(0, 10, 60_000)
    parts = four_way_split(y, seed=0)
    assert tuple(len(p) for p in parts.values()) == FOUR_WAY_SIZES
    allidx = np.concatenate(list(parts.values()))
    assert len(np.unique(allidx)) == 60_000
    freq = np.bincount(y, minlength=10) / len(y)
    for p in parts.values():
        np.testing.assert_allclose(np.bincount(y[p], minlength=10) / len(p), freq, atol=2e-3)


def test_four_way_split_scales_and_is_reproducible():
    y = np.repeat(np.arange(10), 400)
    a, b, c = four_way_split(y, 1), four_way_split(y, 1), four_way_split(y, 2)
    assert [len(v) for v in a.values()] == [2667, 333, 667, 333]
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["target_train"], c["target_train"])


@settings(max_examples=50, deadline=None)
@given(st.integers(20, 400), st.integers(2, 6), st.integers(0, 10_000))
def test_stratified_split_property(n, k, seed):
    y = np.random.default_rng(seed).integers(0, k, n)
    parts = stratified_split(y, [0.5, 0.3, 0.2], np.random.default_rng(seed))
    assert sum(len(p) for p in parts) == n
    assert len(np.unique(np.concatenate(parts))) == n
    assert [len(p) for p in parts] == [round(n * 0.5), round(n * 0.3), n - round(n * 0.5) - round(n * 0.3)] or \
        abs(len(parts[0]) - n * 0.5) <= 1


def test_holdout_and_subsample():
    y = np.repeat(np.arange(10), 100)
    tr, te = stratified_holdout(y, 0.2, 0)
    assert len(te) == 200 and np.bincount(y[te]).tolist() == [20] * 10 and not set(tr) & set(te)
    sub = subsample_stratified(y, 0.5, 0)
    assert len(sub) == 500 and np.bincount(y[sub]).tolist() == [50] * 10
    with pytest.raises(ValueError, match="test_fraction"):
        stratified_holdout(y, 1.0, 0)
    with pytest.raises(ValueError, match="fractions"):
        stratified_split(y, [0.7, 0.6], np.random.default_rng(0))


def test_dirichlet_reproducible_nonempty_and_skewed():
    y = np.random.default_rng(1).integers(0, 10, 4000)
    a = partition("dirichlet", y, 100, seed=3, alpha=0.5)
    b = partition("dirichlet", y, 100, seed=3, alpha=0.5)
    c = partition("dirichlet", y, 100, seed=4, alpha=0.5)
    assert all(np.array_equal(x, z) for x, z in zip(a, b))
    assert any(not np.array_equal(x, z) for x, z in zip(a, c))
    assert min(len(p) for p in a) >= 1
    assert sorted(np.concatenate(a).tolist()) == list(range(4000))  # a partition: disjoint and complete
    counts = class_counts(y, a, 10)
    iid_counts = class_counts(y, partition("iid", y, 100, seed=3), 10)
    # label skew: per-client class distributions are far more concentrated than IID
    top = lambda cc: np.mean(cc.max(1) / np.maximum(cc.sum(1), 1))
    assert top(counts) > top(iid_counts) + 0.15


def test_partition_errors():
    y = np.arange(10) % 2
    with pytest.raises(ValueError, match="larger than the number of samples"):
        dirichlet_partition(y, 11, np.random.default_rng(0))
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_partition(y, 2, np.random.default_rng(0), alpha=0)
    with pytest.raises(ValueError, match="unknown partitioner"):
        partition("shards", y, 2, 0)
    assert {"iid", "dirichlet"} <= set(PARTITIONERS)


def test_data_a_partition_cannot_serve_is_a_one_line_refusal():
    """More clients than samples, or a skew that leaves a client empty: DataError, which the router logs as
    one line before any work (not a traceback), as it does for a missing file."""
    import logging

    from datasets.base import DataError
    from datasets.partition import partition
    from flower_apps.router import OneLineRefusals

    labels = np.array([0, 0, 1, 1, 2])
    for call in (lambda: partition("iid", labels, 6, 0),
                 lambda: partition("dirichlet", labels, 5, 0, alpha=0.01, min_size=2)):
        with pytest.raises(DataError) as info:
            call()
        record = logging.LogRecord("flwr", logging.ERROR, __file__, 1, "ServerApp failed", None,
                                   (DataError, info.value, None))
        assert OneLineRefusals().filter(record) and record.exc_info is None and str(info.value) in record.getMessage()
