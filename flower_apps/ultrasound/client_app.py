"""Ultrasound ClientApp logic: one federated round, or a whole local-only training, for one client.

The client reads everything from the message: the run config (``run-config``), the round
(``server-round``), its logical client (``client-ids``, one per message), and FedProx's ``proximal-mu``
when the strategy sends it.
"""

from __future__ import annotations

import time

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from flower_apps.common.torch_utils import pick_device, record_to_state, state_to_record
from flower_apps.ultrasound import audit
from flower_apps.ultrasound.config import UltrasoundConfig
from datasets.base import DataError
from flower_apps.common.node_data import describe_reply, error_reply, is_query, node_data_path, node_name
from flower_apps.ultrasound.data import build_data, data_key, node_clients
from flower_apps.ultrasound.models import model_skeleton
from flower_apps.ultrasound.train import DpSettings, client_seed, evaluate, lr_at_round, train_local
from privacy.randomness import NoiseSource
from strategies.cohorts import client_ids_of

METRICS_KEY = "metrics"


def dp_settings(cfg: UltrasoundConfig, context: Context | None = None) -> DpSettings | None:
    """DP-SGD settings; the noise source is the client's own (never derived from the run seed).

    A SuperNode started with ``--node-config "noise-seed-file='...'"`` uses its own local file,
    else the run config's ``noise-seed-file`` (read on this node), else OS entropy.
    """
    if not cfg.dp_sgd:
        return None
    node_file = str((context.node_config if context is not None else {}).get("noise-seed-file", ""))
    noise = NoiseSource(node_file or cfg.noise_seed_file)
    return DpSettings(cfg.noise_multiplier, cfg.max_grad_norm, cfg.grad_sample_mode, noise=noise)


def train(msg: Message, context: Context) -> Message:
    """Handle a ``train.ultrasound`` message."""
    t0 = time.perf_counter()
    conf: ConfigRecord = msg.content["config"]
    cfg = UltrasoundConfig.from_json(str(conf["run-config"]))
    name = node_name(context)
    try:  # deployment: this node's data-path only (busi-folder), never the global partition
        path = node_data_path(context, cfg.node_local_data)
        data = build_data(data_key(cfg)) if path is None else node_clients(str(path), name, data_key(cfg))
        if is_query(msg):
            return describe_reply(msg, data.node, data.sizes(), data.label_counts())
        (cid,) = client_ids_of(conf)  # one logical client per message (strategies.fixed_cohort)
        if path is not None and cid not in data.x:
            raise DataError(f"holds clients {sorted(data.x)}, asked for client {cid}")
    except DataError as exc:
        return error_reply(msg, name, exc)
    server_round = int(conf["server-round"])
    device = pick_device(cfg.device)
    model = model_skeleton(cfg.arch, data.num_classes, cfg.image_size, cfg.dp_sgd, cfg.dp_finetune)
    model.load_state_dict(record_to_state(msg.content["arrays"]))
    x, y = data.client_train_data(cid)
    owners = data.train_owners()[data.client_train[cid]] if path is None else data.owners(cid)
    if cfg.mode == "local":
        return _local_only(msg, cfg, cid, model, x, y, owners, data, device, t0, context)
    mu = float(conf["proximal-mu"]) if "proximal-mu" in conf else 0.0
    lr = lr_at_round(cfg.lr, server_round, cfg.num_rounds)
    canaries, x, y, owners = audit.client_hook(cfg, cid, x, y, owners, data.num_classes)  # us-audit-canaries > 0 only
    loss_received = audit.canary_losses(model, canaries, device) if canaries is not None else None
    stats = train_local(model, x, y, epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr_for_epoch=lambda e: lr,
                        device=device, seed=client_seed(cfg.seed, server_round, cid), proximal_mu=mu,
                        dp=dp_settings(cfg, context), owners=owners, profiles=data.profiles,
                        channels_last=cfg.channels_last)
    metrics = MetricRecord({
        "num-examples": int(len(y)), "client-id": cid, "client-ids": [cid], "train-loss": stats.loss,
        "steps": stats.steps,
        "train-seconds": stats.seconds, "step-seconds": stats.step_seconds, "lr": lr, "proximal-mu": mu,
        "trunk-cached": int(stats.trunk_cached),
        "sample-rate": stats.sample_rate or 0.0, "noise-multiplier": cfg.noise_multiplier if cfg.dp_sgd else 0.0,
        "handler-seconds": time.perf_counter() - t0, "cuda": int(device.type == "cuda"),
    })
    content = RecordDict({"arrays": state_to_record(model), METRICS_KEY: metrics})
    if canaries is not None:
        content[audit.AUDIT_RECORD] = audit.audit_record(loss_received, audit.canary_losses(model, canaries, device))
    return Message(content, reply_to=msg)


def _local_only(msg, cfg, cid, model, x, y, owners, data, device, t0, context) -> Message:
    """Local-only baseline: this client alone, T x E epochs with the same schedule, test after each T-step."""
    curve: list[float] = []
    e_per_round = cfg.local_epochs

    def on_epoch_end(epoch: int, m) -> None:
        if epoch % e_per_round == 0:
            curve.append(evaluate(m, data.x["test"], data.y["test"], device)["accuracy"])

    stats = train_local(model, x, y, epochs=cfg.num_rounds * e_per_round, batch_size=cfg.batch_size,
                        lr_for_epoch=lambda e: lr_at_round(cfg.lr, -(-e // e_per_round), cfg.num_rounds),
                        device=device, seed=client_seed(cfg.seed, 0, cid), dp=dp_settings(cfg, context), owners=owners,
                        profiles=data.profiles, on_epoch_end=on_epoch_end, channels_last=cfg.channels_last)
    test = evaluate(model, data.x["test"], data.y["test"], device)
    xv, yv = data.client_val_data(cid)
    val = evaluate(model, xv, yv, device) if len(yv) else {}
    rec = {"num-examples": int(len(y)), "client-id": cid, "client-ids": [cid], "train-loss": stats.loss,
           "steps": stats.steps,
           "train-seconds": stats.seconds, "step-seconds": stats.step_seconds,
           "trunk-cached": int(stats.trunk_cached),
           "sample-rate": stats.sample_rate or 0.0, "noise-multiplier": cfg.noise_multiplier if cfg.dp_sgd else 0.0,
           "acc-curve": curve, "handler-seconds": time.perf_counter() - t0,
           "confusion": [v for row in test["confusion"] for v in row]}
    rec.update({f"test-{k}": float(v) for k, v in test.items() if k != "confusion"})
    rec.update({f"val-{k}": float(v) for k, v in val.items() if k != "confusion"})
    return Message(RecordDict({METRICS_KEY: MetricRecord(rec)}), reply_to=msg)
