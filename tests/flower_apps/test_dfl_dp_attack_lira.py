"""dfl-dp offline LiRA: an overfit target leaks, an untrained one on identical distributions does not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from datasets.image_plan import ImagePlan
from flower_apps.common.local_training import train_local
from flower_apps.dfl_dp.attack_lira import LiraSettings, Recipe, lira_on_plan
from models.small_cnn import build_small_cnn

SIZE, K = 8, 4
RECIPE = Recipe(lr=0.05, momentum=0.9, weight_decay=0.0, batch_size=16)


def _plan(n: int = 48) -> ImagePlan:
    g = torch.Generator().manual_seed(0)
    # Random images with random labels: fitting them means memorizing them.
    xs = {p: torch.randn(n, 1, SIZE, SIZE, generator=g) for p in
          ("test", "target_train", "target_holdout", "shadow_train", "shadow_holdout")}
    ys = {p: torch.randint(0, K, (n,), generator=g) for p in xs}
    return ImagePlan("random", [], K, (1, SIZE, SIZE), (0.0,), (1.0,), xs, ys, [np.arange(n)])


@pytest.fixture(scope="module", autouse=True)
def _threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_overfit_target_leaks():
    plan = _plan()
    model = build_small_cnn(0, 1, K, SIZE)
    train_local(model, plan.x["target_train"], plan.y["target_train"], lr=RECIPE.lr, momentum=RECIPE.momentum,
                weight_decay=0.0, batch_size=16, epochs=40, generator=torch.Generator().manual_seed(0))
    row = lira_on_plan(model.eval(), plan, RECIPE, LiraSettings(num_reference=3, epochs=10, max_candidates=48))
    assert row["auc"] > 0.75, row
    assert row["n_members"] == row["n_nonmembers"] == 48


def test_untrained_target_stays_near_chance():
    plan = _plan(96)
    row = lira_on_plan(build_small_cnn(1, 1, K, SIZE).eval(), plan, RECIPE,
                       LiraSettings(num_reference=3, epochs=2, max_candidates=96))
    assert abs(row["auc"] - 0.5) < 0.12, row


def test_settings_are_checked():
    with pytest.raises(ValueError, match="num_reference"):
        LiraSettings(num_reference=1)


def test_audited_runs_are_no_attack_target(tmp_path):
    """Canary clients' updates are part of an audited run's model: the sweep does not attack it, LiRA refuses it."""
    import argparse

    from flower_apps.dfl_dp.attack_lira import lira_for_run
    from flower_apps.dfl_dp.config import KEYS, PRESETS, build_config
    from flower_apps.dfl_dp.sweep import ATTACK_EPS_CAL, is_attacked

    base = {**KEYS.defaults(), **PRESETS["smoke"], "study": "dfl-dp", "preset": "smoke", "results-dir": str(tmp_path),
            "dp": True, "clip-norm": 1.0, "eps-cal": 2.0}
    args = argparse.Namespace(attacks=True, attack_clip_norm=1.0, attack_eps_cal=list(ATTACK_EPS_CAL))
    plain, audited = build_config(base), build_config({**base, "audit-canaries": 4})
    assert is_attacked(plain, args) and not is_attacked(audited, args)
    with pytest.raises(ValueError, match="audited run"):
        lira_for_run(audited, LiraSettings(num_reference=2, epochs=1))
