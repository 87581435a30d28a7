"""Stratified splits: the four-way target/shadow split and a stratified holdout."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from registry import streams

# Seed paper, Sec. 3.1: 40,000 target-train, 5,000 target-holdout, 10,000 shadow-train,
# 5,000 shadow-holdout out of MNIST's 60,000 training images.
FOUR_WAY_NAMES = ("target_train", "target_holdout", "shadow_train", "shadow_holdout")
FOUR_WAY_SIZES = (40_000, 5_000, 10_000, 5_000)


def _largest_remainder(total: int, fractions: Sequence[float] | np.ndarray) -> np.ndarray:
    raw = np.asarray(fractions, dtype=float) * total
    counts = np.floor(raw).astype(int)
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[: total - counts.sum()]] += 1
    return counts


def stratified_split(
    labels: np.ndarray, fractions: Sequence[float], rng: np.random.Generator
) -> list[np.ndarray]:
    """Split indices into disjoint parts of the given fractions, class by class.

    Global part sizes are the fractions of ``len(labels)`` rounded by largest remainder;
    each class is spread over the parts in the same proportions, so label frequencies are
    preserved in every part up to rounding. Fractions must be positive and sum to <= 1
    (a remainder, if any, is dropped).
    """
    fractions = [float(f) for f in fractions]
    if any(f <= 0 for f in fractions) or sum(fractions) > 1 + 1e-9:
        raise ValueError(f"fractions must be > 0 and sum to <= 1, got {fractions}")
    labels = np.asarray(labels)
    n = len(labels)
    rest = max(0.0, 1.0 - sum(fractions))
    all_fracs = fractions + ([rest] if rest > 1e-12 else [])  # an implicit "dropped" part
    targets = _largest_remainder(n, all_fracs)
    classes = np.unique(labels)
    per_class_idx = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    alloc = np.stack([_largest_remainder(len(per_class_idx[c]), all_fracs) for c in classes])
    # Rounding per class can miss the global part sizes by a few samples: move single samples
    # of some class from a part that has too many to a part that has too few.
    while True:
        diff = targets - alloc.sum(axis=0)
        if not diff.any():
            break
        j_short, j_over = int(np.argmax(diff)), int(np.argmin(diff))
        i = int(np.argmax(alloc[:, j_over]))
        alloc[i, j_over] -= 1
        alloc[i, j_short] += 1
    parts: list[list[np.ndarray]] = [[] for _ in all_fracs]
    for i, c in enumerate(classes):
        start = 0
        for j, k in enumerate(alloc[i]):
            parts[j].append(per_class_idx[c][start : start + k])
            start += k
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts[: len(fractions)]]


def four_way_split(labels: np.ndarray, seed: int,
                   sizes: Sequence[int] = FOUR_WAY_SIZES) -> dict[str, np.ndarray]:
    """The target/shadow split in the proportions of ``sizes``, scaled to ``len(labels)``.

    ``sizes`` are the (target_train, target_holdout, shadow_train, shadow_holdout) counts; the
    default is the seed paper's, which MNIST's 60,000 training images give exactly.
    """
    check_four_way_sizes(sizes)
    total = sum(sizes)
    fractions = [s / total for s in sizes]
    parts = stratified_split(labels, fractions, streams.rng("datasets.four-way-split", seed))
    return dict(zip(FOUR_WAY_NAMES, parts, strict=True))


def check_four_way_sizes(sizes: Sequence[int]) -> None:
    """ValueError unless ``sizes`` are four positive integers (the four-way split's proportions)."""
    if len(sizes) != len(FOUR_WAY_NAMES) or any(isinstance(s, bool) or not isinstance(s, (int, np.integer))
                                                 or s < 1 for s in sizes):
        raise ValueError(f"four-way split sizes must be four integers >= 1 ({', '.join(FOUR_WAY_NAMES)}), "
                         f"got {tuple(sizes)}")


def stratified_holdout(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified (train_idx, test_idx) for sources that have no separate test set."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    test, train = stratified_split(labels, [test_fraction, 1 - test_fraction], streams.rng("datasets.test-split", seed))
    return train, test


def subsample_stratified(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Indices of a stratified ``fraction`` of the data (the sweeps' data-fraction knob)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"data fraction must be in (0, 1], got {fraction}")
    if fraction == 1:
        return np.arange(len(labels))
    return stratified_split(labels, [fraction], streams.rng("datasets.subsample", seed))[0]


def train_and_test(x: np.ndarray, y: np.ndarray, x_test: np.ndarray | None, y_test: np.ndarray | None,
                   test_fraction: float, data_fraction: float, seed: int, holdout_seed: int = 0,
                   holdout_note: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Training and test arrays of a source, and notes on what was done to them.

    A source without a test set gets a stratified ``test_fraction`` held out with ``holdout_seed``
    (the same for every run seed); then a stratified ``data_fraction`` of the training part is kept
    (seeded by ``seed``). Returns (x, y, x_test, y_test, notes).
    """
    notes = []
    y = np.asarray(y)
    if x_test is None or y_test is None:
        tr, te = stratified_holdout(y, test_fraction, holdout_seed)
        x_test, y_test = x[te], y[te]
        x, y = x[tr], y[tr]
        notes.append(f"no separate test set: a stratified {test_fraction:.0%} ({len(te)} images) was held out"
                     + holdout_note)
    if data_fraction < 1:
        keep = subsample_stratified(y, data_fraction, seed)
        x, y = x[keep], y[keep]
        notes.append(f"data-fraction {data_fraction}: {len(keep)} training images used")
    return x, y, x_test, np.asarray(y_test), notes
