"""Attack phase of the dfl-dp sweep: membership inference and gradient inversion on the runs.

Membership inference (Table 5, mia_auc.png): for each attacked target run, the shadow run of
the same (framework, C, eps_cal, seed) trained on shadow-train gives the attack's training
data (shadow-train members vs shadow-holdout non-members); the attack is evaluated on the
target model's outputs for target-train members vs target-holdout non-members.

Gradient inversion (Table 6, Figures 7-8): each captured victim gradient (``victims.pt``) is
attacked by DLG, iDLG and Inverting Gradients; the adversary sees only an AdversaryView.
``view='noised-update'`` is the variant in which the adversary sees the single-example
update (one SGD step, -lr * g) after the run's clipping and Gaussian noise instead.

Each run's results go to ``attacks_mia.json`` / ``attacks_inversion_<view>.json`` in its
folder (atomic; existing files are reused, so the attack phase resumes too).
"""

from __future__ import annotations

import functools
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from attacks.inversion import InversionConfig, bounds_from_normalization, run_attack
from attacks.inversion.metrics import score_reconstruction
from attacks.inversion.view import AdversaryView, view_from_noised_update
from attacks.membership import LabeledOutputs, ShadowAttackData, run_loss_threshold, run_shadow_mia
from datasets.image_plan import build_image_plan
from flower_apps.common.results import atomic_write_json, read_json
from flower_apps.dfl_dp.config import DflDpConfig
from flower_apps.dfl_dp.data import data_key
from flower_apps.dfl_dp.server_app import run_dir
from models.small_cnn import SmallCNN
from privacy.mechanisms import calibrate_sigma_abs
from registry import streams

log = logging.getLogger(__name__)
INVERSION_ATTACKS = ("dlg", "idlg", "invgrad")
VIEWS = ("gradient", "noised-update")


def _load_model(path: Path, plan) -> SmallCNN:
    c, h, _ = plan.image_shape
    m = SmallCNN(c, plan.num_classes, h)
    m.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return m.eval()


def membership_inference(target: DflDpConfig, shadow: DflDpConfig) -> list[dict]:
    """Shadow-model MIA (3 features x 2 classifiers) + loss-threshold baseline for one target run."""
    out_path = run_dir(target) / "attacks_mia.json"
    if out_path.is_file():
        return read_json(out_path)
    plan = build_image_plan(data_key(target))
    t_model = _load_model(run_dir(target) / "final_model.pt", plan)
    s_model = _load_model(run_dir(shadow) / "final_model.pt", build_image_plan(data_key(shadow)))

    def outs(model, part):
        return LabeledOutputs.from_model(model, plan.x[part], plan.y[part].numpy())

    data = ShadowAttackData(outs(s_model, "shadow_train"), outs(s_model, "shadow_holdout"),
                            outs(t_model, "target_train"), outs(t_model, "target_holdout"))
    rows = run_shadow_mia(data, seed=target.seed) + [run_loss_threshold(data, seed=target.seed)]
    for r in rows:
        r.update(framework=target.framework, condition=target.condition, seed=target.seed)
    atomic_write_json(out_path, rows)
    return rows


def _attack_one(job: dict) -> list[dict]:
    torch.set_num_threads(1)  # one thread per process: oversubscription is very slow on small CPUs
    cfg: DflDpConfig = job["cfg"]
    victim = job["victim"]
    plan = build_image_plan(data_key(cfg))
    c, h, _ = plan.image_shape
    factory = functools.partial(SmallCNN, c, plan.num_classes, h)
    shape = plan.image_shape
    if job["view"] == "gradient":
        view = AdversaryView(factory, victim["state"], victim["gradient"], shape, plan.num_classes)
    else:
        sigma = calibrate_sigma_abs(cfg.clip_norm, cfg.num_clients, cfg.eps_cal, cfg.delta_cal) if cfg.dp else 0.0
        g = streams.torch_generator("dfl-dp.inversion-noise", cfg.seed, victim["client"])
        update = [-cfg.lr * t for t in victim["gradient"]]
        view = view_from_noised_update(factory, victim["state"], update, lr=cfg.lr,
                                       clip_norm=cfg.clip_norm if cfg.dp else None, sigma=sigma, generator=g,
                                       input_shape=shape, num_classes=plan.num_classes)
    icfg = InversionConfig(iterations=job["iterations"], restarts=job["restarts"], seed=cfg.seed,
                           pixel_bounds=bounds_from_normalization(plan.mean, plan.std))
    original = plan.x[plan.train_part][victim["index"]]
    rows = []
    for name in INVERSION_ATTACKS:
        res = run_attack(name, view, icfg)
        score = score_reconstruction(res, original, plan.mean, plan.std, true_label=victim["label"])
        rows.append({"framework": cfg.framework, "condition": cfg.condition, "seed": cfg.seed,
                     "client": victim["client"], "index": victim["index"], "attack": name, "view": job["view"],
                     **score,
                     "reconstruction": res.reconstruction.tolist()})
    return rows


def gradient_inversion(configs: list[DflDpConfig], view: str, iterations: int, restarts: int,
                       workers: int | None = None) -> list[dict]:
    """All three inversion attacks on every captured victim of ``configs`` (parallel over victims)."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    rows: list[dict] = []
    todo = []
    for cfg in configs:
        out_path = run_dir(cfg) / f"attacks_inversion_{view}.json"
        if out_path.is_file() and read_json(out_path).get("iterations") == iterations:
            rows += read_json(out_path)["rows"]
            continue
        vpath = run_dir(cfg) / "victims.pt"
        if not vpath.is_file():
            raise FileNotFoundError(f"{vpath} missing: run the sweep with --attacks so training captures victims")
        victims = torch.load(vpath, map_location="cpu", weights_only=True)
        todo.append((cfg, out_path, [{"cfg": cfg, "victim": v, "view": view, "iterations": iterations,
                                      "restarts": restarts} for v in victims]))
    workers = workers or min(os.cpu_count() or 1, 4)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for i, (cfg, out_path, jobs) in enumerate(todo):
            run_rows = [r for rs in pool.map(_attack_one, jobs) for r in rs]
            atomic_write_json(out_path, {"iterations": iterations, "restarts": restarts, "rows": run_rows})
            rows += run_rows
            print(f"[inversion {i + 1}/{len(todo)}] {cfg.default_run_name}: "
                  + ", ".join(f"{r['attack']} SSIM {r['ssim']:.3f}" for r in run_rows[:3]), flush=True)
    return rows
