"""Offline LiRA (Carlini et al. 2022) against the dfl-dp final model, beside the shadow-model MIA.

Same sets as :mod:`flower_apps.dfl_dp.attack_eval` (Table 5): members = target-train (the union
of the clients' training data), non-members = target-holdout. The adversary's reference models
are trained on random halves of its own data, shadow-train and shadow-holdout of the four-way
split, which is disjoint from both candidate sets: every reference model is OUT (offline
variant). They use the study's model and local recipe (SGD, lr, momentum, weight decay, batch
size) trained centrally for ``epochs`` epochs: the adversary mimics the recipe, not the
federation, so the attack needs no shadow training on the target's data.

Threat model: whoever receives the released final model (the server of FL, the last client of
the sequential chain, or any user of the model) and holds same-population data; DP protects
each client's examples against exactly this party.

Writes ``attacks_lira.json`` in the target run's folder (atomic; reused when its settings match).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
import torch

from attacks.membership import logit_confidence, model_outputs, run_offline_lira
from datasets.image_plan import ImagePlan, build_image_plan
from flower_apps.common.local_training import train_local
from flower_apps.common.results import atomic_write_json, read_json
from flower_apps.dfl_dp.config import DflDpConfig
from flower_apps.dfl_dp.data import data_key
from models.small_cnn import SmallCNN, build_small_cnn
from registry import streams

LIRA_FILE = "attacks_lira.json"


@dataclass(frozen=True)
class LiraSettings:
    """Sizes of the LiRA phase (CPU scale by default)."""

    num_reference: int = 8
    max_candidates: int = 1000  # members and non-members each
    epochs: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_reference < 2:
            raise ValueError(f"num_reference must be >= 2 (LiRA fits a variance), got {self.num_reference}")
        if self.max_candidates < 1 or self.epochs < 1:
            raise ValueError(f"max_candidates and epochs must be >= 1, got {self.max_candidates}, {self.epochs}")


@dataclass(frozen=True)
class Recipe:
    """The local training recipe the adversary copies for its reference models."""

    lr: float
    momentum: float
    weight_decay: float
    batch_size: int


def lira_on_plan(model: torch.nn.Module, plan: ImagePlan, recipe: Recipe, s: LiraSettings) -> dict:
    """LiRA on ``model``: target-train members vs target-holdout non-members, pool = shadow parts."""
    rng = streams.rng("dfl-dp.lira-candidates", s.seed)
    n = min(s.max_candidates, len(plan.y["target_train"]), len(plan.y["target_holdout"]))
    mi = np.sort(rng.choice(len(plan.y["target_train"]), n, replace=False))
    oi = np.sort(rng.choice(len(plan.y["target_holdout"]), n, replace=False))
    x_cand = torch.cat([plan.x["target_train"][mi], plan.x["target_holdout"][oi]])
    y_cand = torch.cat([plan.y["target_train"][mi], plan.y["target_holdout"][oi]]).numpy()
    x_pool = torch.cat([plan.x["shadow_train"], plan.x["shadow_holdout"]])
    y_pool = torch.cat([plan.y["shadow_train"], plan.y["shadow_holdout"]])
    c, h, _ = plan.image_shape

    def train_reference(idx: np.ndarray, seed: int) -> torch.nn.Module:
        m = build_small_cnn(seed, c, plan.num_classes, h)
        t = torch.from_numpy(idx)
        train_local(m, x_pool[t], y_pool[t], lr=recipe.lr, momentum=recipe.momentum,
                    weight_decay=recipe.weight_decay, batch_size=recipe.batch_size, epochs=s.epochs,
                    generator=torch.Generator().manual_seed(seed))
        return m.eval()

    def statistic(m: torch.nn.Module) -> np.ndarray:
        return logit_confidence(model_outputs(m, x_cand), y_cand)

    is_member = np.r_[np.ones(n, np.int64), np.zeros(n, np.int64)]
    return run_offline_lira(model, is_member, statistic=statistic, train_reference=train_reference,
                            pool_size=len(y_pool), num_reference=s.num_reference, seed=s.seed)


def lira_for_run(target: DflDpConfig, s: LiraSettings = LiraSettings()) -> dict:
    """LiRA for one finished target run (its ``final_model.pt``); one row like Table 5's."""
    from flower_apps.dfl_dp.server_app import run_dir

    if target.audit_canaries:  # canary clients' updates are in its aggregate: not the condition's model
        raise ValueError(f"{target.default_run_name} is an audited run (audit-canaries={target.audit_canaries}); "
                         "attacks measure unaudited runs only")
    out_path = run_dir(target) / LIRA_FILE
    want = json.loads(json.dumps(asdict(s)))
    if out_path.is_file() and read_json(out_path).get("settings") == want:
        return read_json(out_path)["row"]
    model_file = run_dir(target) / "final_model.pt"
    if not model_file.is_file():
        raise FileNotFoundError(f"{model_file} missing: the target run has not finished")
    plan = build_image_plan(data_key(target))
    c, h, _ = plan.image_shape
    model = SmallCNN(c, plan.num_classes, h)
    model.load_state_dict(torch.load(model_file, map_location="cpu", weights_only=True))
    row = lira_on_plan(model.eval(), plan, Recipe(target.lr, target.momentum, target.weight_decay,
                                                  target.batch_size), s)
    row.update(feature="logit-confidence", classifier="lira-offline", framework=target.framework,
               condition=target.condition, seed=target.seed)
    atomic_write_json(out_path, {"settings": want, "row": row})
    return row
