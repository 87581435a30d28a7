"""Attacks on the tabular-pdp federated model of each setting (vanilla / GDP / PDP).

Threat model (who the DP settings protect, and against what we measure): an honest-but-curious
party that receives the final global model of a setting (the server, a participant, or anyone
the model is released to), knows the schema and the training recipe, and holds population data
disjoint from the victim's. It attacks one victim client:

* membership inference: members = the victim's training rows, non-members = the victim's own
  held-out rows (same region, same anonymization, same distribution). Two attacks: the
  loss threshold (Yeom et al. 2018) with its threshold chosen on a shadow model trained on the
  adversary's data (the regression form of the shadow attack: with the single loss feature a
  monotone attack classifier has exactly the threshold's ROC), and offline LiRA
  (:mod:`attacks.membership.lira`) with reference models trained on the adversary's pool.
* attribute inference (:mod:`attacks.attribute`): for a member row with one sensitive attribute
  unknown (default ``Smoking``, a risk factor the severity score depends on), try every value
  and keep the best fit to the known severity; compared with the prior mode, and on members vs
  non-members. Run it on a raw-data run (``tab-levels 0,0,0,0``, ``tab-k 1``) and an anonymized
  run to compare raw vs anonymized training data.

The adversary's pool is the other participants' rows (never the victim's), i.e. data from the
same population that the adversary could plausibly hold. Reference / shadow models use the
study's model and optimizer (Adam, MSE) trained centrally for ``reference_epochs`` epochs: the
adversary mimics the recipe, not the federation.

Input: a finished run folder (``summary.json`` and ``final_model_<setting>.pt`` per setting,
written by the server app). Output: ``attacks.json`` in the run folder (atomic). A setting trained
with audit canaries (GDP / PDP of a ``tab-audit-canaries > 0`` run) is not attacked: the canary
clients' updates are part of its released model, so its rows say "skipped: audited run".
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attacks.attribute import attribute_inference_summary
from attacks.membership import best_loss_threshold, regression_statistic, roc_summary, run_offline_lira
from flower_apps.common.report_card import AUDITED, is_audited_run
from flower_apps.common.results import atomic_write_json, read_json
from flower_apps.tabular_pdp.card import CARD, tabular_setting_audited
from flower_apps.tabular_pdp.config import TabularPdpConfig
from flower_apps.tabular_pdp.data import client_data, data_key, model_features
from flower_apps.tabular_pdp.model import SeverityMLP, build_model, train_local
from flower_apps.tabular_pdp.server_app import model_path, run_dir  # model_path re-exported: where the models lie
from registry import streams

ATTACKS_FILE = "attacks.json"


@dataclass(frozen=True)
class AttackSettings:
    """Sizes of the attack phase (CPU scale by default)."""

    victim: int | None = None  # None: the first participant
    max_candidates: int = 500  # members and non-members each
    pool_rows: int = 2000  # adversary's population rows (from the other participants)
    num_reference: int = 8
    reference_epochs: int = 20
    attributes: tuple[str, ...] = ("Smoking",)
    attribute_candidates: int = 11  # grid over the attribute's encoded range [0, 1]
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("max_candidates", "pool_rows", "reference_epochs", "attribute_candidates"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be >= 2, got {getattr(self, name)}")
        if self.num_reference < 2:
            raise ValueError(f"num_reference must be >= 2 (LiRA fits a variance), got {self.num_reference}")


@dataclass
class TabularTarget:
    """The victim's candidates, the adversary's pool and the recipe of the attacked model."""

    features: tuple[str, ...]
    x_members: np.ndarray
    y_members: np.ndarray
    x_nonmembers: np.ndarray
    y_nonmembers: np.ndarray
    x_pool: np.ndarray
    y_pool: np.ndarray
    lr: float
    batch_size: int
    victim: int
    meta: dict = field(default_factory=dict)


def build_target(cfg: TabularPdpConfig, levels: tuple[int, ...], participants: list[int],
                 settings: AttackSettings) -> TabularTarget:
    """Candidates from the victim's train / held-out rows, pool from the other participants."""
    if len(participants) < 2:
        raise ValueError(f"need the victim and at least one other participant for the pool, got {participants}")
    victim = participants[0] if settings.victim is None else settings.victim
    if victim not in participants:
        raise ValueError(f"victim {victim} is not a participant of the run ({participants})")
    key, feats = data_key(cfg), model_features(cfg.features, levels)

    def data(cid: int):
        return client_data(key, cid, tuple(levels), cfg.k, cfg.features, cfg.test_fraction, cfg.seed,
                           cfg.poison if cid == cfg.poison_client else "none", cfg.poison_scale)

    rng = streams.rng("attacks.victim-candidates", settings.seed, victim)
    v = data(victim)
    n = min(settings.max_candidates, len(v.y_train), len(v.y_test))
    mi = np.sort(rng.choice(len(v.y_train), n, replace=False))
    oi = np.sort(rng.choice(len(v.y_test), n, replace=False))
    others = [data(c) for c in participants if c != victim]
    xp = np.concatenate([np.concatenate([d.x_train.numpy(), d.x_test.numpy()]) for d in others])
    yp = np.concatenate([np.concatenate([d.y_train.numpy(), d.y_test.numpy()]) for d in others])
    pi = np.sort(rng.choice(len(yp), min(settings.pool_rows, len(yp)), replace=False))
    return TabularTarget(feats, v.x_train.numpy()[mi], v.y_train.numpy()[mi], v.x_test.numpy()[oi],
                         v.y_test.numpy()[oi], xp[pi], yp[pi], cfg.lr, cfg.batch_size, victim,
                         {"levels": list(levels), "k": cfg.k})


@torch.no_grad()
def predict(model: nn.Module, x: np.ndarray) -> np.ndarray:
    """Predicted severity for rows ``x``."""
    model.eval()
    return model(torch.from_numpy(np.ascontiguousarray(x, np.float32))).double().numpy()


def _trainer(t: TabularTarget, epochs: int):
    def train(idx: np.ndarray, seed: int) -> nn.Module:
        m = build_model(seed, t.x_pool.shape[1])
        g = torch.Generator().manual_seed(seed)
        train_local(m, torch.from_numpy(t.x_pool[idx]), torch.from_numpy(t.y_pool[idx]), lr=t.lr,
                    batch_size=t.batch_size, epochs=epochs, generator=g, device=torch.device("cpu"))
        return m
    return train


def membership_rows(model: nn.Module, t: TabularTarget, s: AttackSettings) -> list[dict]:
    """Shadow-calibrated loss threshold and offline LiRA against ``model``."""
    x_cand = np.concatenate([t.x_members, t.x_nonmembers])
    y_cand = np.concatenate([t.y_members, t.y_nonmembers])
    is_member = np.r_[np.ones(len(t.y_members), np.int64), np.zeros(len(t.y_nonmembers), np.int64)]
    train = _trainer(t, s.reference_epochs)
    # Shadow model: trained on one half of the pool (its members), the other half its non-members.
    t0 = time.perf_counter()
    half = streams.rng("attacks.shadow-halves", s.seed).permutation(len(t.y_pool))
    sin, sout = np.sort(half[: len(half) // 2]), np.sort(half[len(half) // 2:])
    shadow = train(sin, s.seed)
    sq = lambda m, x, y: (predict(m, x) - y) ** 2
    tau, _ = best_loss_threshold(sq(shadow, t.x_pool[sin], t.y_pool[sin]), sq(shadow, t.x_pool[sout], t.y_pool[sout]))
    loss = sq(model, x_cand, y_cand)
    rows = [{"attack": "loss-threshold-shadow", **roc_summary(is_member, -loss), "threshold": tau,
             "accuracy": float(0.5 * (np.mean(loss[is_member == 1] <= tau) + np.mean(loss[is_member == 0] > tau))),
             "n_members": int(is_member.sum()), "n_nonmembers": int((1 - is_member).sum()),
             "attack_seconds": time.perf_counter() - t0}]
    lira = run_offline_lira(model, is_member, statistic=lambda m: regression_statistic(predict(m, x_cand), y_cand),
                            train_reference=train, pool_size=len(t.y_pool), num_reference=s.num_reference,
                            seed=s.seed)
    rows.append({**lira, "attack_seconds": lira["reference_seconds"]})
    return rows


def attribute_rows(model: nn.Module, t: TabularTarget, s: AttackSettings) -> list[dict]:
    """Model-based attribute inference for each sensitive attribute present among the model inputs."""
    rows: list[dict] = []
    candidates = np.linspace(0.0, 1.0, s.attribute_candidates)  # every encoded feature lies in [0, 1]
    for name in s.attributes:
        if name not in t.features:
            rows.append({"attack": "attribute-inference", "attribute": name, "skipped": "not a model input"})
            continue
        col = t.features.index(name)
        res = attribute_inference_summary(lambda x: predict(model, x), (t.x_members, t.y_members),
                                          (t.x_nonmembers, t.y_nonmembers), t.x_pool[:, col], col, candidates)
        rows.append({"attack": "attribute-inference", "attribute": name, **res})
    return rows


def attack_model(model: nn.Module, t: TabularTarget, s: AttackSettings) -> list[dict]:
    """All attacks on one model; every row carries the victim and the anonymization levels."""
    rows = membership_rows(model, t, s) + attribute_rows(model, t, s)
    for r in rows:
        r.update(victim=t.victim, **t.meta)
    return rows


def load_final_model(run_folder: Path, setting: str, in_features: int) -> SeverityMLP:
    """The final global model of ``setting``; a clear error when the run did not store it."""
    path = model_path(run_folder, setting)
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: the attacks need the final global model of each setting "
                                "(the tabular-pdp server app must save it as final_model_<setting>.pt)")
    m = SeverityMLP(in_features)
    m.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return m.eval()


def attack_run(run_folder: str | Path, cfg: TabularPdpConfig, settings: AttackSettings = AttackSettings()
               ) -> list[dict]:
    """Every attack on every setting of one finished run; cached in ``attacks.json`` (same settings).

    A setting trained with audit canaries gets one row ``{"setting", "skipped": "skipped: audited run"}``.
    """
    folder = Path(run_folder)
    out = folder / ATTACKS_FILE
    summary_path = folder / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path} missing: the run has not finished")
    summary = read_json(summary_path)
    if not summary.get("settings"):
        raise ValueError(f"{folder} is a drift-detection-only run (no trained settings to attack)")
    audited = cfg.audit_canaries > 0 or is_audited_run(folder, summary)
    skip = {k for k, v in summary["settings"].items() if tabular_setting_audited(k, v, audited)}
    if out.is_file():
        cached = read_json(out)
        if cached.get("settings") == json.loads(json.dumps(asdict(settings))) and \
                skip == {r["setting"] for r in cached["rows"] if r.get("skipped") == AUDITED}:
            return cached["rows"]
    rows = [{"setting": k, "seed": cfg.seed, "skipped": AUDITED} for k in summary["settings"] if k in skip]
    todo = [k for k in summary["settings"] if k not in skip]
    if not todo:
        atomic_write_json(out, {"settings": asdict(settings), "rows": rows})
        return rows
    levels = tuple(summary["levels"])
    t = build_target(cfg, levels, list(summary["participants"]), settings)
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    for setting in todo:
        model = load_final_model(folder, setting, len(t.features))
        for r in attack_model(model, t, settings):
            r.update(setting=setting, seed=cfg.seed)
            rows.append(r)
    atomic_write_json(out, {"settings": asdict(settings), "rows": rows})
    return rows


RAW_DATA_DIR = "raw-data"


def raw_data_keys(results_dir: str) -> dict:
    """Run keys of the raw-data twin of a run: no generalization, no suppression (levels 0, k = 1).

    Its folder lives under ``<results>/tabular-pdp/raw-data/`` so the study's own tables (Table III,
    drift) never mix it with the anonymized runs; the report card reads both.
    """
    return {"tab-levels": "0,0,0,0", "tab-k": 1,
            "results-dir": str(Path(results_dir) / "tabular-pdp" / RAW_DATA_DIR)}


def attack_phase(configs: list[TabularPdpConfig], settings: AttackSettings = AttackSettings()) -> str:
    """The sweep's ``--attacks`` phase: every finished training run attacked, then the report card.

    A run without saved final models is listed as skipped (its card cells say "not run").
    """
    from flower_apps.common.report_card import write_card

    lines = []
    for cfg in configs:
        if not cfg.settings:  # drift-demonstration runs train no model
            continue
        name = (cfg.run_name or cfg.default_run_name) + (" (raw data)" if Path(cfg.results_dir).name == RAW_DATA_DIR
                                                          else "")
        try:
            rows = attack_run(run_dir(cfg), cfg, settings)
        except FileNotFoundError as exc:
            lines.append(f"- {name}: attacks not run ({exc})")
            continue
        best = max((r["auc"] for r in rows if "auc" in r), default=float("nan"))
        skipped = sorted(r["setting"] for r in rows if r.get("skipped") == AUDITED)
        lines.append(f"- {name}: {len(rows) - len(skipped)} attack rows, best MIA AUC {best:.3f}"
                     + (f"; {', '.join(skipped)}: {AUDITED} (canary clients in the aggregate)" if skipped else ""))
    print("\n".join(lines), flush=True)
    md = "\n### Attacks\n\n" + "\n".join(lines) + "\n"
    roots = {Path(c.results_dir) for c in configs if Path(c.results_dir).name != RAW_DATA_DIR}
    for root in sorted(roots):
        md += "\n" + write_card(CARD, root / "tabular-pdp")
    return md
