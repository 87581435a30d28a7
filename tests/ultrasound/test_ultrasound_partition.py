"""Ultrasound partitions: sizes, label skew, quantity skew, determinism, client validation sets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datasets.partition import PARTITIONERS, partition
from datasets.ultrasound_partition import (
    client_validation_sets,
    ipf_counts,
    label_quantity_skew_partition,
    lognormal_sizes,
    partition_table,
)

LABELS = np.repeat([0, 1, 2], [107, 350, 167])  # BUSI's training split class sizes (624)


def _tv_from_global(labels, parts):
    p = np.bincount(labels, minlength=3) / len(labels)
    return np.mean([0.5 * np.abs(np.bincount(labels[i], minlength=3) / len(i) - p).sum() for i in parts])


def test_registered_in_the_shared_registry():
    assert "label-quantity-skew" in PARTITIONERS


@pytest.mark.parametrize("label_skew,quantity_skew", [(True, True), (True, False), (False, True), (False, False)])
def test_every_sample_used_exactly_once(label_skew, quantity_skew):
    parts = partition("label-quantity-skew", LABELS, 8, seed=3, label_skew=label_skew, quantity_skew=quantity_skew,
                      min_size=2)
    allidx = np.concatenate(parts)
    assert len(parts) == 8 and len(allidx) == len(LABELS) and len(np.unique(allidx)) == len(LABELS)
    assert min(len(p) for p in parts) >= 2


def test_label_skew_is_much_stronger_than_iid():
    iid = partition("iid", LABELS, 8, seed=0)
    skew = partition("label-quantity-skew", LABELS, 8, seed=0, alpha=0.5, quantity_skew=False)
    tv_iid, tv_skew = _tv_from_global(LABELS, iid), _tv_from_global(LABELS, skew)
    assert tv_iid < 0.1 and tv_skew > 3 * tv_iid and tv_skew > 0.25


def test_label_skew_alone_keeps_sizes_equal_and_quantity_skew_alone_keeps_mixtures():
    skew = partition("label-quantity-skew", LABELS, 8, seed=1, quantity_skew=False)
    assert max(abs(len(p) - 78) for p in skew) <= 3  # equal sizes up to rounding (about C samples)
    qty = partition("label-quantity-skew", LABELS, 8, seed=1, label_skew=False, sigma=1.0)
    sizes = np.array([len(p) for p in qty])
    assert sizes.std() / sizes.mean() > 0.3  # log-normal(0, 1) sizes are visibly unequal
    assert _tv_from_global(LABELS, qty) < 0.05  # but each client's class mixture stays global


def test_same_seed_same_partition_different_seed_different():
    a = partition("label-quantity-skew", LABELS, 8, seed=7)
    b = partition("label-quantity-skew", LABELS, 8, seed=7)
    c = partition("label-quantity-skew", LABELS, 8, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_lognormal_sizes_sum_and_minimum():
    sizes = lognormal_sizes(624, 8, np.random.default_rng(0), sigma=0.5, min_size=10)
    assert sizes.sum() == 624 and sizes.min() >= 10
    np.testing.assert_array_equal(lognormal_sizes(100, 4, np.random.default_rng(0), sigma=0.0), [25, 25, 25, 25])
    with pytest.raises(ValueError, match="cannot give"):
        lognormal_sizes(10, 4, np.random.default_rng(0), min_size=3)


def test_ipf_hand_case_keeps_odds_and_margins():
    # Rows 2:1 in class 0 and 1:2 in class 1 with equal margins -> the hand solution [[20, 10], [10, 20]].
    pi = np.array([[2 / 3, 1 / 3], [1 / 3, 2 / 3]])
    out = ipf_counts(pi, np.array([30, 30]), np.array([30, 30]))
    np.testing.assert_array_equal(out, [[20, 10], [10, 20]])


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 10), st.integers(0, 10_000))
def test_ipf_columns_exact_rows_close(k, seed):
    rng = np.random.default_rng(seed)
    cols = np.array([40, 200, 90])
    pi = rng.dirichlet(np.full(3, 0.3), size=k)
    rows = lognormal_sizes(int(cols.sum()), k, rng)
    out = ipf_counts(pi, rows, cols)
    np.testing.assert_array_equal(out.sum(0), cols)
    assert np.abs(out.sum(1) - rows).max() <= 3


def test_client_validation_proportional_and_disjoint():
    vals = client_validation_sets(np.arange(78), np.array([100, 50, 50, 0, 112]), np.random.default_rng(0))
    sizes = [len(v) for v in vals]
    # 78 * [100, 50, 50, 0, 112] / 312 = [25, 12.5, 12.5, 0, 28]: largest remainder, ties to the first
    assert sizes == [25, 13, 12, 0, 28]
    assert len(np.unique(np.concatenate(vals))) == 78


def test_partition_table_rows():
    rows = partition_table(np.array([0, 0, 1, 1, 1]), [np.array([0, 2]), np.array([1, 3, 4])], ("a", "b"))
    assert rows[0] == {"client": 0, "size": 2, "share (%)": 40.0, "a (%)": 50.0, "b (%)": 50.0}
    assert rows[1]["a (%)"] == pytest.approx(33.3) and rows[1]["b (%)"] == pytest.approx(66.7)


def test_label_quantity_skew_refuses_bad_input():
    with pytest.raises(ValueError, match="alpha"):
        label_quantity_skew_partition(LABELS, 8, np.random.default_rng(0), alpha=0.0)
    with pytest.raises(ValueError, match="cannot give"):
        label_quantity_skew_partition(LABELS[:10], 8, np.random.default_rng(0), min_size=2)
