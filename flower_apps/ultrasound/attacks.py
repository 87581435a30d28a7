"""Attacks on the ultrasound federated model, without DP and with DP-SGD.

Threat model. Membership inference: whoever receives the final global model (the server, any
client, any user of the released model) and holds images of the same population; it attacks one
victim client. Members = the victim's training images, non-members = the global test split
(never trained on, same distribution). Its shadow / reference data is the validation split and
the *other* clients' training images: disjoint from both candidate sets. Attacks: the shadow
model attack and loss threshold of :mod:`attacks.membership` (shadow model trained on half of the
adversary's pool), and offline LiRA (:mod:`attacks.membership.lira`), whose reference models
need no shadow data of the target. Reference and shadow models copy the study's recipe (same
architecture and DP form, Adam at the run's lr) without DP-SGD noise, trained centrally.

Gradient inversion: an honest-but-curious server that sees one client's update for a
single-example step. ``view="gradient"``: the raw single-example gradient at the final model
state; ``view="dp-sgd"``: the same gradient as DP-SGD releases it for a batch of one (clipped to
``max-grad-norm`` C, plus N(0, (z C)^2) per coordinate: what the client's per-step privatized
gradient reveals). DLG, iDLG and InvGrad from :mod:`attacks.inversion`; SSIM / PSNR / MSE against
the true image (ground truth meets the reconstruction only in the metrics); the wall time per
image is reported as the attack's cost.

Input: a finished run folder with ``final_model.pt`` (the server app's final global state dict)
and its config. Output: ``attacks_mia.json``, ``attacks_inversion.json`` and
``figure_reconstructions.png`` in the run folder (atomic). An audited run (canary images in
client 0's training set) is not attacked: its member set is no longer client 0's training images
and the canaries shaped the released model; it is reported as "skipped: audited run".
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attacks.inversion import InversionConfig, bounds_from_normalization, run_attack
from attacks.inversion.figures import GridRow, save_reconstruction_grid
from attacks.inversion.metrics import score_reconstruction
from attacks.inversion.view import AdversaryView, capture_single_example_gradient, view_from_noised_update
from attacks.membership import (
    LabeledOutputs,
    ShadowAttackData,
    logit_confidence,
    run_loss_threshold,
    run_offline_lira,
    run_shadow_mia,
)
from datasets.transforms import IMAGENET_MEAN, IMAGENET_STD, to_model_input, uint8_to_unit
from flower_apps.common.report_card import AUDITED, is_audited_run
from flower_apps.common.results import atomic_write_json, read_json
from flower_apps.ultrasound.card import CARD
from flower_apps.ultrasound.data import UltrasoundData
from flower_apps.ultrasound.train import predict_probs, train_local
from registry import streams

INVERSION_ATTACKS = ("dlg", "idlg", "invgrad")
VIEWS = ("gradient", "dp-sgd")
MIA_FILE, INVERSION_FILE, FIGURE = "attacks_mia.json", "attacks_inversion.json", "figure_reconstructions.png"


@dataclass(frozen=True)
class UsAttackSettings:
    """Sizes of the attack phase (CPU scale by default)."""

    victim: int = 0
    max_candidates: int = 100  # members and non-members each
    num_reference: int = 4
    reference_epochs: int = 3
    victims: int = 2  # images attacked by inversion
    iterations: int = 200
    restarts: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_reference < 2:
            raise ValueError(f"num_reference must be >= 2 (LiRA fits a variance), got {self.num_reference}")
        for name in ("max_candidates", "reference_epochs", "victims", "iterations", "restarts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class Recipe:
    """What the adversary copies: a fresh model of the run's architecture, the run's batch size and lr."""

    make_model: Callable[[int], nn.Module]  # seed -> untrained model (same architecture and DP form)
    batch_size: int
    lr: float


def _candidates(data: UltrasoundData, s: UsAttackSettings):
    if not 0 <= s.victim < len(data.client_train):
        raise ValueError(f"victim must be a client in [0, {len(data.client_train)}), got {s.victim}")
    rng = streams.rng("attacks.victim-candidates", s.seed, s.victim)
    own = data.client_train[s.victim]
    n = min(s.max_candidates, len(own), len(data.y["test"]))
    if n < 2:
        raise ValueError(f"victim {s.victim} has {len(own)} training images; need >= 2 members and non-members")
    mi = torch.from_numpy(np.sort(rng.choice(own, n, replace=False)))
    oi = torch.from_numpy(np.sort(rng.choice(len(data.y["test"]), n, replace=False)))
    others = np.concatenate([c for k, c in enumerate(data.client_train) if k != s.victim] or [np.zeros(0, int)])
    others_t = torch.from_numpy(others.astype(np.int64))
    x_pool = torch.cat([data.x["val"], data.x["train"][others_t]])
    y_pool = torch.cat([data.y["val"], data.y["train"][others_t]])
    if len(y_pool) < 4:
        raise ValueError(f"the adversary's pool (val + other clients) has {len(y_pool)} images; need >= 4")
    return (data.x["train"][mi], data.y["train"][mi], data.x["test"][oi], data.y["test"][oi], x_pool, y_pool)


def _trainer(recipe: Recipe, x_pool: torch.Tensor, y_pool: torch.Tensor, epochs: int):
    def train(idx: np.ndarray, seed: int) -> nn.Module:
        m = recipe.make_model(seed)
        t = torch.from_numpy(np.asarray(idx, dtype=np.int64))
        train_local(m, x_pool[t], y_pool[t], epochs=epochs, batch_size=recipe.batch_size,
                    lr_for_epoch=lambda e: recipe.lr, device=torch.device("cpu"), seed=seed)
        return m.eval()
    return train


def membership_rows(model: nn.Module, data: UltrasoundData, recipe: Recipe, s: UsAttackSettings) -> list[dict]:
    """Shadow-model MIA (3 features x 2 classifiers), loss threshold and offline LiRA against ``model``."""
    xm, ym, xo, yo, xp, yp = _candidates(data, s)
    cpu = torch.device("cpu")
    train = _trainer(recipe, xp, yp, s.reference_epochs)
    half = streams.rng("attacks.shadow-halves", s.seed).permutation(len(yp))
    sin, sout = np.sort(half[: len(half) // 2]), np.sort(half[len(half) // 2:])
    t0 = time.perf_counter()
    shadow = train(sin, s.seed)

    def outs(m, x, y):
        return LabeledOutputs(predict_probs(m, x, cpu), y.numpy())

    data4 = ShadowAttackData(outs(shadow, xp[torch.from_numpy(sin)], yp[torch.from_numpy(sin)]),
                             outs(shadow, xp[torch.from_numpy(sout)], yp[torch.from_numpy(sout)]),
                             outs(model, xm, ym), outs(model, xo, yo))
    rows = run_shadow_mia(data4, seed=s.seed) + [run_loss_threshold(data4, seed=s.seed)]
    shadow_seconds = time.perf_counter() - t0
    for r in rows:
        r["attack_seconds"] = shadow_seconds
    x_cand, y_cand = torch.cat([xm, xo]), torch.cat([ym, yo]).numpy()
    is_member = np.r_[np.ones(len(ym), np.int64), np.zeros(len(yo), np.int64)]
    lira = run_offline_lira(model, is_member,
                            statistic=lambda m: logit_confidence(predict_probs(m, x_cand, cpu), y_cand),
                            train_reference=train, pool_size=len(yp), num_reference=s.num_reference, seed=s.seed)
    rows.append({"feature": "logit-confidence", "classifier": "lira-offline", **lira,
                 "attack_seconds": lira["reference_seconds"]})
    for r in rows:
        r["victim"] = s.victim
    return rows


def inversion_rows(model: nn.Module, data: UltrasoundData, make_model: Callable[[], nn.Module], view: str,
                   s: UsAttackSettings, clip_norm: float | None = None, noise_multiplier: float = 0.0
                   ) -> list[dict]:
    """DLG, iDLG, InvGrad on ``s.victims`` of the victim's training images; one row per (image, attack)."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    if view == "dp-sgd" and not (clip_norm and clip_norm > 0):
        raise ValueError(f"view 'dp-sgd' needs clip_norm > 0 (the run's max-grad-norm), got {clip_norm}")
    own = data.client_train[s.victim]
    picks = streams.rng("ultrasound.inversion-picks", s.seed, s.victim).choice(own, min(s.victims, len(own)), replace=False)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    size = data.x["train"].shape[-1]
    shape, k = (3, size, size), data.num_classes
    icfg = InversionConfig(iterations=s.iterations, restarts=s.restarts, seed=s.seed,
                           pixel_bounds=bounds_from_normalization(IMAGENET_MEAN, IMAGENET_STD))
    rows = []
    for j, i in enumerate(picks):
        x = to_model_input(uint8_to_unit(data.x["train"][int(i)][None]))  # (1, 3, S, S), normalized
        y = int(data.y["train"][int(i)])
        grad = capture_single_example_gradient(model, x, y)
        if view == "gradient":
            v = AdversaryView(make_model, state, tuple(grad), shape, k)  # the view copies it into a tuple
        else:  # DP-SGD for a batch of one: clip the per-sample gradient to C, add N(0, (z C)^2); lr 1 -> u = -g
            g = streams.torch_generator("ultrasound.inversion-noise", s.seed, j)
            assert clip_norm is not None  # the DP-SGD view is asked for with the run's max_grad_norm
            v = view_from_noised_update(make_model, state, [-t for t in grad], lr=1.0, clip_norm=clip_norm,
                                        sigma=noise_multiplier * clip_norm, generator=g, input_shape=shape,
                                        num_classes=k)
        for name in INVERSION_ATTACKS:
            t0, c0 = time.perf_counter(), time.process_time()
            res = run_attack(name, v, icfg)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            rows.append({"attack": name, "view": view, "index": int(i), "victim": s.victim, "label": y,
                         **score_reconstruction(res, x, IMAGENET_MEAN, IMAGENET_STD, true_label=y),
                         "seconds_per_image": seconds, "cpu_seconds_per_image": cpu,  # CPU time: robust to load
                         "iterations": s.iterations, "restarts": s.restarts,
                         "reconstruction": res.reconstruction.tolist()})
    return rows


def reconstruction_figure(rows: list[dict], data: UltrasoundData, path: Path, title: str) -> Path | None:
    """Original vs each attack's reconstruction, one figure row per (view, image)."""
    grid = []
    for (view, index) in dict.fromkeys((r["view"], r["index"]) for r in rows):
        recs = {r["attack"]: torch.tensor(r["reconstruction"]) for r in rows
                if r["view"] == view and r["index"] == index}
        original = to_model_input(uint8_to_unit(data.x["train"][index][None]))[0]
        grid.append(GridRow(title, f"{view}, image {index}", original, recs))
    if not grid:
        return None
    return save_reconstruction_grid(path, grid, list(INVERSION_ATTACKS), IMAGENET_MEAN, IMAGENET_STD)


def model_factory(cfg, num_classes: int) -> Callable[..., nn.Module]:
    """``make(seed=None)``: the run's architecture in its DP form (keys of ``final_model.pt``);
    ``make(seed)``: a fresh model started as the run's was (same weights source and DP form), own seed."""
    from flower_apps.ultrasound.models import create_model, model_skeleton

    finetune = cfg.dp_finetune  # how DP-SGD treats BatchNorm (models.DP_FINETUNE): changes the state keys

    def make(seed: int | None = None) -> nn.Module:
        if seed is None:
            return model_skeleton(cfg.arch, num_classes, cfg.image_size, cfg.dp_sgd, finetune)
        return create_model(cfg.arch, num_classes, cfg.image_size, dp=cfg.dp_sgd, pretrained=cfg.pretrained,
                            weights_dir=cfg.weights_dir, seed=seed, dp_finetune=finetune,
                            head_init=cfg.head_init)[0]
    return make


def load_final_model(run_folder: str | Path, cfg, num_classes: int) -> nn.Module:
    """The released global model of a finished federated run, in eval mode; clear errors when absent."""
    path = Path(run_folder) / "final_model.pt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: the attacks need the final global model "
                                "(the ultrasound server app must save it as final_model.pt)")
    model = model_factory(cfg, num_classes)()
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))  # strict: a key mismatch names the keys
    return model.eval()


def audited(run_folder: str | Path, cfg) -> bool:
    """Whether the run trained with audit canaries (its config, its run name, or the files it wrote)."""
    from flower_apps.ultrasound.audit import is_audited

    return (int(getattr(cfg, "audit_canaries", 0) or 0) > 0 or (hasattr(cfg, "run_name") and is_audited(cfg))
            or is_audited_run(Path(run_folder)))


def attack_run(run_folder: str | Path, cfg, s: UsAttackSettings = UsAttackSettings()) -> dict[str, Any]:
    """All attacks on one finished federated run (``final_model.pt``); cached per settings.

    An audited run is not attacked: ``{"skipped": "skipped: audited run", "mia": [], "inversion": []}``.
    """
    from flower_apps.ultrasound.data import build_data, data_key

    folder = Path(run_folder)
    if audited(folder, cfg):
        return {"skipped": AUDITED, "mia": [], "inversion": []}
    want = json.loads(json.dumps(asdict(s)))
    cached = {}
    for name in (MIA_FILE, INVERSION_FILE):
        p = folder / name
        if p.is_file() and read_json(p).get("settings") == want:
            cached[name] = read_json(p)["rows"]
    if len(cached) == 2:
        return {"mia": cached[MIA_FILE], "inversion": cached[INVERSION_FILE]}
    if not (folder / "final_model.pt").is_file():
        raise FileNotFoundError(f"{folder / 'final_model.pt'} missing: the attacks need the final global model "
                                "(the ultrasound server app must save it as final_model.pt)")
    if cfg.mode != "federated":
        raise ValueError(f"attacks target the federated model; {folder} is a {cfg.mode!r} run")
    data = build_data(data_key(cfg))
    make = model_factory(cfg, data.num_classes)
    model = load_final_model(folder, cfg, data.num_classes)
    mia = cached.get(MIA_FILE) or membership_rows(model, data, Recipe(make, cfg.batch_size, cfg.lr), s)
    atomic_write_json(folder / MIA_FILE, {"settings": want, "rows": mia})
    inv = cached.get(INVERSION_FILE)
    if inv is None:
        inv = inversion_rows(model, data, make, "gradient", s)
        if cfg.dp_sgd:
            inv += inversion_rows(model, data, make, "dp-sgd", s, cfg.max_grad_norm, cfg.noise_multiplier)
        atomic_write_json(folder / INVERSION_FILE, {"settings": want, "rows": inv})
        reconstruction_figure(inv, data, folder / FIGURE, cfg.dp_label)
    return {"mia": mia, "inversion": inv}


def attack_phase(configs: list, s: UsAttackSettings = UsAttackSettings()) -> str:
    """The sweep's ``--attacks`` phase: every finished federated run attacked, then the report card.

    A run without a saved final model is listed as skipped (its card cells say "not run").
    """
    from flower_apps.common.report_card import write_card
    from flower_apps.ultrasound.server_app import run_dir

    lines = []
    for cfg in configs:
        if cfg.mode != "federated":  # centralized / local baselines release no federated model
            continue
        name = cfg.run_name or cfg.default_run_name
        try:
            t0 = time.perf_counter()
            res = attack_run(run_dir(cfg), cfg, s)
        except FileNotFoundError as exc:
            lines.append(f"- {name}: attacks not run ({exc})")
            continue
        if res.get("skipped"):
            lines.append(f"- {name}: {res['skipped']} (audit canaries in the training data)")
            continue
        auc = max((r["auc"] for r in res["mia"]), default=float("nan"))
        ssim = max((r["ssim"] for r in res["inversion"]), default=float("nan"))
        lines.append(f"- {name}: best MIA AUC {auc:.3f}, best inversion SSIM {ssim:.3f} "
                     f"({time.perf_counter() - t0:.0f} s)")
    print("\n".join(lines), flush=True)
    md = "\n### Attacks\n\n" + "\n".join(lines) + "\n"
    for root in sorted({Path(c.results_dir) for c in configs}):
        md += "\n" + write_card(CARD, root / "ultrasound")
    return md
