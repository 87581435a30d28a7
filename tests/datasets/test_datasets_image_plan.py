"""datasets.image_plan: golden splits from before the move out of dfl-dp, disjointness, early refusals."""

import hashlib

import numpy as np
import pytest

from datasets.base import ArrayDataset
from datasets.image_plan import ImagePlanKey, build_image_plan, raw_image_split
from datasets.registry import DATASETS

SOURCE = "tiny-test"
PART_NAMES = ("target_train", "target_holdout", "shadow_train", "shadow_holdout")


@pytest.fixture
def loads(monkeypatch) -> list[int]:
    """Register a 240-image 8x8 source without a test set (as mnist-5k); count its loads."""
    calls: list[int] = []

    def tiny(_data_dir=None) -> ArrayDataset:
        calls.append(1)
        rng = np.random.default_rng(2024)
        x = rng.integers(0, 256, (240, 8, 8), dtype=np.uint8)
        return ArrayDataset(SOURCE, x, np.repeat(np.arange(4), 60), None, None, 4, (0.5,), (0.25,))

    monkeypatch.setitem(DATASETS, SOURCE, tiny)
    build_image_plan.cache_clear()
    yield calls
    build_image_plan.cache_clear()


def _digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.asarray(a, np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()


# Produced by flower_apps/dfl_dp/data.py (raw_split, build_data_plan) at c490f13, before the move.
GOLDEN = [
    (dict(data_part="target", seed=0, num_clients=3, dirichlet_alpha=0.5, data_fraction=1.0), [63, 31, 34],
     "dfa0e7618dc2ae77762c504400681246d56e041e4a8f1e5f5b1d4975911ea31b",
     "b6477d4a12371dd009956079199304735feee43835bf172e8fc8c1eddefd943a",
     "4a06d6118b1d105ca52c4025b2f8f8d94a697b4a4edc3ec28c966f87ee6d5c57"),
    (dict(data_part="shadow", seed=0, num_clients=3, dirichlet_alpha=0.5, data_fraction=1.0), [15, 7, 10],
     "dfa0e7618dc2ae77762c504400681246d56e041e4a8f1e5f5b1d4975911ea31b",
     "8117ca7bf24ecfc3e9c829e90718cfe894b8efacc1f849d719b43ade0bb57f65",
     "4a06d6118b1d105ca52c4025b2f8f8d94a697b4a4edc3ec28c966f87ee6d5c57"),
    (dict(data_part="target", seed=7, num_clients=5, dirichlet_alpha=0.1, data_fraction=0.5), [2, 17, 16, 20, 9],
     "ec6f569d200d311c4ed50186669da69b9d7a39bcbd2fc3a5d2c2d3eef7426d36",
     "22fd99b111919d3464f23a22c32c261a160b0390871465639a8c8fcf410b64d5",
     "9a6edaa9214dd993be522fa82070fc1377e1afca2e664d5a73f60be13cc7bedb"),
]


@pytest.mark.parametrize("kw, sizes, parts, clients, images", GOLDEN)
def test_plan_matches_the_dfl_dp_plan_before_the_move(loads, kw, sizes, parts, clients, images):
    key = ImagePlanKey(SOURCE, test_fraction=0.2, **kw)
    raw = raw_image_split(key)
    assert [len(c) for c in raw.clients] == sizes
    assert _digest(raw.parts[p] for p in PART_NAMES) == parts
    assert _digest(raw.clients) == clients
    plan = build_image_plan(key)
    h = hashlib.sha256()
    for q in ("test", "target_train", "shadow_train"):
        h.update(plan.x[q].numpy().tobytes())
    assert h.hexdigest() == images


def test_plan_is_deterministic_per_seed(loads):
    a, b = raw_image_split(ImagePlanKey(SOURCE, 3, 0.5, 1)), raw_image_split(ImagePlanKey(SOURCE, 3, 0.5, 1))
    c = raw_image_split(ImagePlanKey(SOURCE, 3, 0.5, 2))
    assert all(np.array_equal(a.parts[p], b.parts[p]) for p in PART_NAMES)
    assert all(np.array_equal(u, v) for u, v in zip(a.clients, b.clients, strict=True))
    assert not np.array_equal(a.parts["target_train"], c.parts["target_train"])
    plan = build_image_plan(ImagePlanKey(SOURCE, 3, 0.5, 1))
    assert plan is build_image_plan(ImagePlanKey(SOURCE, 3, 0.5, 1))  # cached on the key
    assert len(loads) == 4


@pytest.mark.parametrize("data_part", ["target", "shadow"])
def test_parts_and_test_set_are_disjoint_and_every_client_holds_data(loads, data_part):
    raw = raw_image_split(ImagePlanKey(SOURCE, 4, 0.3, 0, data_part=data_part))
    idx = np.concatenate([raw.parts[p] for p in PART_NAMES])
    assert len(np.unique(idx)) == len(idx) == len(raw.y_all)  # the four parts partition the kept images
    train_rows = {row.tobytes() for row in raw.x_all}  # the source's random images are all distinct
    assert not any(row.tobytes() in train_rows for row in raw.x_test)
    assert raw.train_part == f"{data_part}_train"
    n = len(raw.parts[raw.train_part])
    assert min(len(c) for c in raw.clients) >= 1
    assert np.array_equal(np.sort(np.concatenate(raw.clients)), np.arange(n))  # disjoint and complete
    plan = build_image_plan(ImagePlanKey(SOURCE, 4, 0.3, 0, data_part=data_part))
    x0, y0 = plan.client_data(0)
    assert x0.shape == (len(raw.clients[0]), 1, 8, 8)
    assert np.array_equal(y0.numpy(), raw.y_all[raw.parts[raw.train_part]][raw.clients[0]])
    assert plan.class_counts().sum() == n


def test_split_sizes_set_the_proportions(loads):
    raw = raw_image_split(ImagePlanKey(SOURCE, 2, 1.0, 0, split_sizes=(1, 1, 1, 1)))
    assert [len(raw.parts[p]) for p in PART_NAMES] == [48, 48, 48, 48]  # 192 kept after the 48-image test set


@pytest.mark.parametrize("kw, message", [
    (dict(dirichlet_alpha=0.0), "dirichlet_alpha must be a finite number > 0, got 0.0"),
    (dict(dirichlet_alpha=-1.0), "dirichlet_alpha must be a finite number > 0"),
    (dict(dirichlet_alpha=float("nan")), "dirichlet_alpha must be a finite number > 0"),
    (dict(dataset="no-such-source"), "unknown dataset 'no-such-source'; allowed: "),
    (dict(num_clients=0), "num_clients must be an integer >= 1, got 0"),
    (dict(seed=-1), "seed must be an integer >= 0"),
    (dict(data_fraction=0.0), r"data_fraction must be in \(0, 1\]"),
    (dict(test_fraction=1.0), r"test_fraction must be in \(0, 1\)"),
    (dict(data_part="both"), r"data_part must be one of \['shadow', 'target'\], got 'both'"),
    (dict(split_sizes=(4, 1, 1)), "four-way split sizes must be four integers >= 1"),
])
def test_bad_input_is_refused_before_any_data_is_loaded(loads, kw, message):
    args = dict(dataset=SOURCE, num_clients=3, dirichlet_alpha=0.5, seed=0) | kw
    with pytest.raises(ValueError, match=message):
        ImagePlanKey(**args)
    assert loads == []


def test_more_clients_than_train_samples_is_refused_before_partitioning(loads, monkeypatch):
    import datasets.image_plan as image_plan

    monkeypatch.setattr(image_plan, "dirichlet_partition", lambda *a, **k: pytest.fail("partitioned"))
    with pytest.raises(ValueError, match=r"num_clients \(200\) is larger than the target_train samples \(128\)"):
        raw_image_split(ImagePlanKey(SOURCE, 200, 0.5, 0))
