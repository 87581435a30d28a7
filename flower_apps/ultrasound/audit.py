"""Empirical example-level audit of the ultrasound study's DP-SGD, in the same training run (``sweep --audit``).

One-run audit (Steinke, Nasr, Jagielski, NeurIPS 2023; math in :mod:`privacy.audit.example_level`):
the auditor gives one client (``AUDITED_CLIENT``) m canary examples, each included in its
training set independently with probability 1/2, lets the federated run proceed unchanged,
and scores each canary on the models that client *releases* (its update every round).

Threat model: the adversary of example-level DP-SGD on the audited client's data. It chose the
canaries and its coin flips and sees every model the client sends (white box on the released
updates), or, in the weaker "last update" view, only the client's final released model. It never
sees the client's real examples. Canaries are input-space examples (gradient-space Dirac canaries
would need a hook inside Opacus' clipping step; they are audited on the plain mechanism in
tests/privacy/test_audit_example_level.py):

* ``random-pixels``: out-of-distribution images (uniform random pixels) with uniformly random labels;
* ``mislabelled``: m of the client's own training images, removed from its set and re-inserted
  (with probability 1/2) with a label moved to another class.

Score of a canary: the loss decrease it sees from the released updates, summed over rounds
(every-update view), or minus its loss under the client's last released model (last-update view).

Composition, not patching: :class:`AuditGrid` is a grid view (like ``strategies.base.FastGrid``)
that adds the audit request to the audited client's train messages and takes the client's audit
record out of its replies before the strategy sees them. The client computes the canary losses
(:func:`client_hook`) because it holds the models; both losses are functions of the model it
received and the model it releases only, so they are exactly what the auditor could compute.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from flwr.app import ConfigRecord

from flower_apps.common.results import atomic_write_json, read_json
from flower_apps.common.tables import write_table
from flower_apps.config import ConfigError
from flower_apps.ultrasound.data import build_data, data_key
from flower_apps.ultrasound.train import predict_probs
from privacy.audit.example_level import audit_from_scores, inclusion_bits

AUDITED_CLIENT = 0
CANARY_KINDS = ("random-pixels", "mislabelled")
DEFAULT_CANARIES = 32  # smoke / CPU scale: BUSI clients hold ~40-160 images; more canaries would swamp them
CONFIDENCE = 0.95
AUDIT_RECORD = "audit"  # the reply's ConfigRecord the auditor reads (and removes before aggregation)
_SEED_TAG = 0xA0D17  # separates the canary stream from every other use of the run seed


@dataclass(frozen=True)
class AuditRequest:
    """What the auditor asks of the audited client (carried in its train messages' config)."""

    canaries: int
    kind: str
    seed: int
    client: int = AUDITED_CLIENT

    def __post_init__(self) -> None:
        if self.canaries < 2:
            raise ConfigError(f"--audit: need at least 2 canaries, got {self.canaries}")
        if self.kind not in CANARY_KINDS:
            raise ConfigError(f"--audit-canary: got {self.kind!r}; allowed: {list(CANARY_KINDS)}")

    def to_config(self) -> dict:
        return {"audit-canaries": self.canaries, "audit-kind": self.kind, "audit-seed": self.seed,
                "audit-client": self.client}

    @classmethod
    def from_config(cls, conf: ConfigRecord) -> "AuditRequest | None":
        if "audit-canaries" not in conf:
            return None
        return cls(int(conf["audit-canaries"]), str(conf["audit-kind"]), int(conf["audit-seed"]),
                   int(conf["audit-client"]))

    def included(self) -> np.ndarray:
        """The auditor's coin flips (the first draws of the canary stream: the same on server and client)."""
        return inclusion_bits(self.canaries, self._rng())

    def _rng(self) -> np.random.Generator:
        return np.random.default_rng([_SEED_TAG, self.seed])


@dataclass
class Canaries:
    """The canary set on the audited client: images (uint8, like the data), labels, inclusion bits."""

    x: torch.Tensor  # (m, S, S) uint8
    y: torch.Tensor  # (m,) int64
    included: np.ndarray  # (m,) bool
    drop: np.ndarray  # indices of the client's own examples turned into canaries (mislabelled kind)

    def insert(self, x: torch.Tensor, y: torch.Tensor, owners: np.ndarray, cid: int):
        """The client's training set with the canaries removed from it and the included ones appended."""
        keep = np.setdiff1d(np.arange(len(y)), self.drop)
        sel = torch.from_numpy(np.flatnonzero(self.included))
        kx = torch.from_numpy(keep)
        return (torch.cat([x[kx], self.x[sel]]), torch.cat([y[kx], self.y[sel]]),
                np.concatenate([owners[keep], np.full(len(sel), cid, dtype=owners.dtype)]))


def make_canaries(req: AuditRequest, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> Canaries:
    """The canaries of ``req`` for a client holding uint8 images ``x`` (n, S, S) and labels ``y``."""
    rng = req._rng()
    included = inclusion_bits(req.canaries, rng)
    m = req.canaries
    if num_classes < 2:
        raise ValueError(f"canaries need at least 2 classes, got {num_classes}")
    if req.kind == "random-pixels":
        size = tuple(x.shape[1:])
        imgs = torch.from_numpy(rng.integers(0, 256, size=(m, *size), dtype=np.uint8))
        labels = torch.from_numpy(rng.integers(0, num_classes, size=m).astype(np.int64))
        return Canaries(imgs, labels, included, np.zeros(0, dtype=np.int64))
    if m > len(y) // 2:
        raise ValueError(f"mislabelled canaries: {m} canaries need a client with >= {2 * m} training images, "
                         f"client {req.client} has {len(y)}")
    idx = np.sort(rng.choice(len(y), size=m, replace=False))
    shift = torch.from_numpy(rng.integers(1, num_classes, size=m).astype(np.int64))  # never the true class
    labels = (y[torch.from_numpy(idx)] + shift) % num_classes
    return Canaries(x[torch.from_numpy(idx)], labels, included, idx)


def canary_losses(model: torch.nn.Module, canaries: Canaries, device: torch.device) -> list[float]:
    """Cross-entropy of each canary (its canary label) under ``model``: a function of the model only."""
    p = predict_probs(model, canaries.x, device)
    return [float(v) for v in -np.log(np.clip(p[np.arange(len(p)), canaries.y.numpy()], 1e-12, None))]


def client_hook(conf: ConfigRecord, cid: int, x: torch.Tensor, y: torch.Tensor, owners: np.ndarray,
                num_classes: int) -> tuple[Canaries | None, torch.Tensor, torch.Tensor, np.ndarray]:
    """On the client: (canaries or None, training set with the included canaries) for logical client ``cid``."""
    req = AuditRequest.from_config(conf)
    if req is None or req.client != cid:
        return None, x, y, owners
    can = make_canaries(req, x, y, num_classes)
    return (can, *can.insert(x, y, owners, cid))


def audit_record(loss_received: list[float], loss_released: list[float]) -> ConfigRecord:
    """The client's reply record: canary losses under the model it received and the model it releases."""
    return ConfigRecord({"loss-received": loss_received, "loss-released": loss_released})


class AuditGrid:
    """A grid view that carries the audit request to the audited client and collects its canary losses."""

    def __init__(self, grid, req: AuditRequest) -> None:
        self._grid = grid
        self.req = req
        self._pending: set[str] = set()
        self.rounds: list[tuple[list[float], list[float]]] = []  # (received, released) per round

    def __getattr__(self, name: str):  # everything else is the real grid's
        return getattr(self._grid, name)

    def push_messages(self, messages):
        messages = list(messages)
        for msg in messages:
            conf = msg.content.config_records.get("config") if msg.has_content() else None
            if conf is not None and list(conf.get("client-ids", [])) == [self.req.client]:
                conf.update(self.req.to_config())  # build_train_messages gives each message its own record
        ids = list(self._grid.push_messages(messages))
        for msg, mid in zip(messages, ids):
            conf = msg.content.config_records.get("config") if msg.has_content() else None
            if conf is not None and "audit-canaries" in conf:
                self._pending.add(mid)
        return ids

    def pull_messages(self, message_ids):
        got = list(self._grid.pull_messages(message_ids))
        for msg in got:
            mid = msg.metadata.reply_to_message_id
            if mid in self._pending and msg.has_content() and AUDIT_RECORD in msg.content.config_records:
                rec = msg.content.config_records[AUDIT_RECORD]
                self.rounds.append((list(rec["loss-received"]), list(rec["loss-released"])))
                del msg.content[AUDIT_RECORD]  # the strategy sees the reply it would see without the audit
                self._pending.discard(mid)
        return got


def scores(rounds: list[tuple[list[float], list[float]]]) -> dict[str, np.ndarray]:
    """Attack scores (higher = more likely included) per threat model from the per-round canary losses."""
    if not rounds:
        raise RuntimeError("the audited client sent no canary losses: was it in the cohort?")
    rec = np.asarray([r[0] for r in rounds])
    rel = np.asarray([r[1] for r in rounds])
    return {"every-update": (rec - rel).sum(0),  # loss decrease caused by each released update, summed
            "last-update": -rel[-1]}  # low loss under the client's final released model


def run_audit(req: AuditRequest, rounds: list[tuple[list[float], list[float]]], delta: float,
              eps_formal: float | None) -> dict:
    """audit.json's content: per threat model the one-run lower bound, its counts and the point estimates."""
    included = req.included()
    out = {"method": "one-run audit (Steinke, Nasr, Jagielski 2023), input-space canaries",
           "canary_kind": req.kind, "canaries": req.canaries, "included": int(included.sum()),
           "audited_client": req.client, "rounds_scored": len(rounds), "delta": delta, "confidence": CONFIDENCE,
           "eps_formal_rdp": eps_formal, "threat_models": {}}
    for view, s in scores(rounds).items():
        out["threat_models"][view] = {**audit_from_scores(s, included, delta, CONFIDENCE).to_dict(),
                                      "scores": [float(v) for v in s]}  # to recompute or re-analyse later
    out["included_bits"] = [int(b) for b in included]
    return out


def check_auditable(cfg, req: AuditRequest) -> None:
    """Refuse, before any work, a run the audit cannot observe."""
    if cfg.mode != "federated":
        raise ConfigError(f"--audit: {cfg.mode!r} runs release no client update the auditor can see; "
                          "only federated runs are audited")
    if req.client >= cfg.num_clients:
        raise ConfigError(f"--audit: audited client {req.client} is not among the {cfg.num_clients} clients")
    if req.kind == "mislabelled":
        n = len(build_data(data_key(cfg)).client_train[req.client])
        if req.canaries > n // 2:
            raise ConfigError(f"--audit: {req.canaries} mislabelled canaries need >= {2 * req.canaries} "
                              f"training images on client {req.client}; it has {n}")


def audited_name(cfg, req: AuditRequest) -> str:
    """The folder of an audited run: the canaries change the training set, so never the un-audited run's."""
    return f"{cfg.run_name or cfg.default_run_name}_audit-{req.kind}-m{req.canaries}"


def audited_config(cfg, req: AuditRequest):
    return dataclasses.replace(cfg, run_name=audited_name(cfg, req)) if cfg.mode == "federated" else cfg


def is_audited(cfg) -> bool:
    return "_audit-" in (cfg.run_name or "")


def audited_server_main(server_main: Callable, run_dir: Callable[[object], Path],
                        req_of: Callable[[object], AuditRequest]) -> Callable:
    """``server_main`` with the audit around it for audited configs (others run unchanged).

    Writes ``audit.json`` and ``audit.md``/``.csv`` into the run folder and adds ``audit`` to summary.json.
    """

    def main(grid, cfg) -> dict:
        if not is_audited(cfg):
            return server_main(grid, cfg)
        req = req_of(cfg)
        check_auditable(cfg, req)
        view = AuditGrid(grid, req)
        summary = server_main(view, cfg)
        acc = summary.get("accounting") or {}
        eps_formal = next((r["eps_rdp"] for r in acc.get("per_client", []) if r["client"] == req.client), None)
        res = run_audit(req, view.rounds, cfg.delta, eps_formal)
        out = run_dir(cfg)
        atomic_write_json(out / "audit.json", res)
        write_table([{"threat model": v, "eps formal (RDP)": "no DP" if eps_formal is None else eps_formal,
                      "eps audited lower bound": a["eps_lower"], "eps point (guess accuracy)": a["eps_point"],
                      "eps point (Gaussian fit)": a["eps_gaussian_fit"], "guesses": a["guesses"],
                      "correct": a["correct"], "k+": a["k_plus"], "k-": a["k_minus"]}
                     for v, a in res["threat_models"].items()], out / "audit",
                    f"Empirical audit of client {req.client}'s DP-SGD: {req.canaries} {req.kind} canaries, "
                    f"delta = {cfg.delta}", f"Lower bound at {CONFIDENCE:.0%} confidence (Bonferroni over the "
                    "(k+, k-) choices); the point estimates carry no confidence.")
        summary = {**read_json(out / "summary.json"), "audit": res}
        atomic_write_json(out / "summary.json", summary)
        return summary

    return main


def audit_complete(is_complete: Callable[[object], bool], run_dir: Callable[[object], Path]) -> Callable:
    """A run counts as done only with its audit (a crash between summary and audit reruns it)."""
    return lambda cfg: is_complete(cfg) and (not is_audited(cfg) or (run_dir(cfg) / "audit.json").is_file())


AUDIT_NOTE = ("eps audited >=: one-run lower bound (Steinke et al. 2023) at 95% confidence on client 0's DP-SGD, "
              "from input-space canaries scored on its released updates (every update) or on its last one; the "
              "point estimates carry no confidence (Gaussian fit: noisy with few canaries). A lower bound far below "
              "eps RDP is expected for one-run input-space audits at this scale (few canaries, few steps); one "
              "ABOVE eps RDP would be a bug in the DP-SGD pipeline or its accounting.")


def lower_bound(summary: dict, view: str = "every-update") -> float:
    """The audited lower bound of a finished run's summary (nan when not audited)."""
    a = summary.get("audit")
    return a["threat_models"][view]["eps_lower"] if a else math.nan


def audit_cells(runs: list[dict]) -> dict:
    """Columns beside the RDP epsilon in the DP tables: mean audited lower bound over the seeds."""
    cells = {}
    for view in ("every-update", "last-update"):
        vals = [lower_bound(r, view) for r in runs if r.get("audit")]
        cells[f"eps audited >= ({view})"] = f"{np.mean(vals):.3g}" if vals else "-"
    return cells


def audit_rows(summaries: list[dict]) -> list[dict]:
    """One row per audited run: formal epsilon of the audited client beside the audited ones."""
    rows = []
    for s in sorted((s for s in summaries if s.get("audit")), key=lambda s: s["run"]):
        a = s["audit"]
        row = {"run": s["run"], "method": s["method"],
               "DP-SGD": f"C={s['max_grad_norm']:g}, z={s['noise_multiplier']:g}" if s["dp_sgd"] else "none",
               "canaries": f"{a['canaries']} {a['canary_kind']} ({a['included']} in)",
               "eps RDP (client)": "inf (no DP)" if a["eps_formal_rdp"] is None else f"{a['eps_formal_rdp']:.3g}"}
        for view, t in a["threat_models"].items():
            row[f"eps audited >= ({view})"] = f"{t['eps_lower']:.3g}"
            row[f"correct / guesses ({view})"] = f"{t['correct']}/{t['guesses']}"
            row[f"point: accuracy / Gaussian fit ({view})"] = f"{t['eps_point']:.2g} / {t['eps_gaussian_fit']:.2g}"
        rows.append(row)
    return rows
