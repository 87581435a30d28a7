"""One audited client training through the real ClientApp and DP optimizer, for the detection benchmark.

``benchmarks/audit_detection.py`` and tests call :func:`audit_trial` (issue 37): client 0 alone, round
after round, with the white-box gradient audit (:mod:`flower_apps.ultrasound.gradient_audit`).
"""

from __future__ import annotations

import time

from flwr.app import ConfigRecord

from flower_apps.ultrasound.gradient_audit import DEFAULT_GRADIENT_CANARIES, run_gradient_audit
from strategies.flwr_adapter import task_identity
from strategies.records import array_record


def client_rounds(cfg, view=None, client: int = 0):
    """``client`` trained alone for ``cfg.num_rounds`` rounds through the real ClientApp handler, each round from
    its own last release; ``view`` (an ``audit.AuditRecords``) takes each reply. The last release's ArrayRecord."""
    from flwr.app import Context, RecordDict

    from flower_apps.common.torch_utils import state_to_record
    from flower_apps.ultrasound import client_app
    from flower_apps.ultrasound.config import ACTION
    from flower_apps.ultrasound.models import create_model
    from strategies.cohorts import build_messages

    data_classes = _num_classes(cfg)
    model, _ = create_model(cfg.arch, data_classes, cfg.image_size, dp=cfg.dp_sgd, pretrained=cfg.pretrained,
                            weights_dir=cfg.weights_dir, seed=cfg.seed, dp_finetune=cfg.dp_finetune,
                            head_init=cfg.head_init)
    arrays = state_to_record(model)
    with task_identity():
        for r in range(1, cfg.num_rounds + 1):
            conf = ConfigRecord({"run-config": cfg.to_json(), "server-round": r})
            (msg,) = build_messages([(1, [client])], arrays, conf, ACTION)
            reply = client_app.train(msg, Context(1, 1, {}, RecordDict(), {}))
            if reply.has_error():
                raise RuntimeError(f"client {client}, round {r}: the client failed: {reply.error.reason}")
            if view is not None:
                view.take(reply)
            arrays = array_record(reply.content["arrays"])
    return arrays


def _num_classes(cfg) -> int:
    from flower_apps.ultrasound.data import build_data, data_key

    return build_data(data_key(cfg)).num_classes


def audit_trial(fault: str, seed: int, preset: str = "smoke", **overrides) -> dict:
    """One audited client training: client 0 alone for the preset's rounds, each round starting from its
    own last release, through the real ClientApp handler and DP optimizer; the gradient audit's dict.

    ``fault``: '' (the correct mechanism) or a fault of privacy/faults.py (needs ``PPFL_ALLOW_DP_FAULTS=1``);
    ``overrides``: run keys with '_' for '-' (``num_rounds=3``, ``us_audit_canaries=64``). The dict gets
    ``wall_seconds`` (the whole trial, model and data set-up included).
    """
    from flower_apps.router import prepare
    from flower_apps.ultrasound import audit

    t0 = time.perf_counter()
    keys = {"study": "ultrasound", "preset": preset, "us-dp-sgd": True, "us-audit-canary": "gradient",
            "us-audit-canaries": DEFAULT_GRADIENT_CANARIES, "dp-fault": fault, "seed": seed,
            **{k.replace("_", "-"): v for k, v in overrides.items()}}
    cfg = prepare(keys)[1]
    req = audit.AuditRequest.of(cfg)
    assert req is not None  # us-audit-canaries set above
    audit.check_auditable(cfg, req)
    view = audit.AuditRecords(req)
    client_rounds(cfg, view, req.client)
    res = run_gradient_audit(req, view.gradient, cfg)
    res["wall_seconds"] = time.perf_counter() - t0
    return res
