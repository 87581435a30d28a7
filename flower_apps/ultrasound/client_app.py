"""Ultrasound ClientApp logic: one federated round, or a whole local-only training, for one client.

``train.ultrasound`` (:func:`train`): the client reads everything from the message: the run config
(``run-config``), the round (``server-round``), its logical client (``client-ids``, one per message),
and FedProx's ``proximal-mu`` when the strategy sends it. ``query.ultrasound`` (:func:`query`): the
describe query of a node-local deployment (flower_apps/common/node_data.py). The study evaluates on
the coordinator: no ``evaluate`` handler.
"""

from __future__ import annotations

import hashlib
import os
import time

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from datasets.base import DataError
from flower_apps.common.node_data import DESCRIBE, describe_reply, error_reply, node_data_path, node_name, query_name
from flower_apps.common.torch_utils import pick_device, record_to_state, state_to_record
from flower_apps.config import noise_condition
from flower_apps.ultrasound import audit, gradient_audit
from flower_apps.ultrasound.config import UltrasoundConfig
from flower_apps.ultrasound.data import build_data, data_key, node_clients
from flower_apps.ultrasound.models import model_skeleton
from flower_apps.ultrasound.study import NODE_SEED_KEY, NOISE_SEED_ENV
from flower_apps.ultrasound.train import DpSettings, client_seed, lr_at_round, train_local
from flower_apps.ultrasound.train import evaluate as evaluate_model  # not a handler: no evaluate.ultrasound
from privacy.faults import noise_divisor
from privacy.randomness import NoiseSource
from strategies.cohorts import client_ids_of
from strategies.records import array_record, config_of, number

METRICS_KEY = "metrics"


class NoiseSeedError(ValueError):
    """A node asked for seeded DP-SGD noise that has no usable seed file of its own."""


def node_seed_file(context: Context | None) -> str:
    """This node's own seed file: its SuperNode's ``--node-config noise-seed-file``, else ``$PPFL_NOISE_SEED_FILE``.

    Both are the node's configuration; the run config (the coordinator's) is never read here.
    """
    node_config = context.node_config if context is not None else {}
    return str(node_config.get(NODE_SEED_KEY, "") or os.environ.get(NOISE_SEED_ENV, ""))


def received_digest(arrays: ArrayRecord) -> str:
    """SHA-256 of a received model (names, dtypes, shapes, bytes): part of a seeded stream's condition."""
    h = hashlib.sha256()
    for name, a in arrays.items():
        h.update(f"{name}|{a.dtype}|{tuple(a.shape)}|".encode())
        h.update(a.data)
    return h.hexdigest()


def dp_settings(cfg: UltrasoundConfig, context: Context | None = None,
                received: ArrayRecord | None = None) -> DpSettings | None:
    """DP-SGD settings; the noise source is the training node's own (never the run seed, never the run config).

    ``us-noise-mode='secure'``: OS entropy. ``'seeded'``: this node's own seed file
    (:func:`node_seed_file`), mixed with the run's condition (:func:`flower_apps.config.noise_condition`)
    and the model the node received: a coordinator that sends the same round twice with another model
    gets other noise, so it cannot cancel the noise of two replies. A node asked for seeded noise that
    has no seed file of its own raises :class:`NoiseSeedError` (the client replies with it) rather than
    falling back to OS entropy or to a path the coordinator names.
    """
    if not cfg.dp_sgd:
        return None
    noise = NoiseSource()
    if cfg.noise_mode == "seeded":
        path = node_seed_file(context)
        if not path:
            raise NoiseSeedError(
                f"us-noise-mode='seeded' but this node has no seed file of its own: start its SuperNode with "
                f"--node-config \"{NODE_SEED_KEY}='/path'\" (in a simulation: {NOISE_SEED_ENV}=/path in its "
                "environment); the run config never names a client's seed file")
        condition = noise_condition(cfg) + ("" if received is None else "/" + received_digest(received))
        noise = NoiseSource(path, condition=condition)
        try:
            noise.check()
        except (OSError, ValueError) as exc:
            raise NoiseSeedError(f"this node's seed file: {exc}") from None
    # dp-fault (issue 37, tests only): the optimizer's noise multiplier shrinks; the metrics and ledger keep z
    return DpSettings(cfg.noise_multiplier, cfg.max_grad_norm, cfg.grad_sample_mode, noise=noise,
                      noise_divisor=noise_divisor(cfg.dp_fault))


def _data(cfg: UltrasoundConfig, context: Context | None, name: str):
    """(data-path or None, the data this node serves): its busi-folder, else the global partition."""
    path = node_data_path(context, cfg.node_local_data)
    return path, build_data(data_key(cfg)) if path is None else node_clients(str(path), name, data_key(cfg))


def query(msg: Message, context: Context) -> Message:
    """Answer the describe query (``query.ultrasound``): the clients this node holds, their sizes and label counts."""
    query_name(msg, (DESCRIBE,))  # the only query it answers; any other is refused before any work
    cfg = UltrasoundConfig.from_json(str(msg.content["config"]["run-config"]))
    name = node_name(context)
    try:
        _, data = _data(cfg, context, name)
    except DataError as exc:
        return error_reply(msg, name, exc)
    return describe_reply(msg, name, data.sizes(), data.label_counts())


def train(msg: Message, context: Context) -> Message:
    """Handle a ``train.ultrasound`` message."""
    t0 = time.perf_counter()
    conf: ConfigRecord = config_of(msg.content["config"])
    cfg = UltrasoundConfig.from_json(str(conf["run-config"]))
    name = node_name(context)
    try:  # deployment: this node's data-path only (busi-folder), never the global partition
        path, data = _data(cfg, context, name)
        (cid,) = client_ids_of(conf)  # one logical client per message (strategies.fixed_cohort)
        if path is not None and cid not in data.x:
            raise DataError(f"holds clients {sorted(data.x)}, asked for client {cid}")
    except DataError as exc:
        return error_reply(msg, name, exc)
    try:  # before any work: a node asked for seeded noise without a seed file of its own refuses
        dp = dp_settings(cfg, context, array_record(msg.content["arrays"]))
    except NoiseSeedError as exc:
        return error_reply(msg, name, exc)
    server_round = int(number(conf["server-round"]))
    device = pick_device(cfg.device)
    model = model_skeleton(cfg.arch, data.num_classes, cfg.image_size, cfg.dp_sgd, cfg.dp_finetune)
    model.load_state_dict(record_to_state(array_record(msg.content["arrays"])))
    x, y = data.client_train_data(cid)
    owners = data.train_owners()[data.client_train[cid]] if path is None else data.owners(cid)
    if cfg.mode == "local":
        return _local_only(msg, cfg, cid, model, x, y, owners, data, device, t0, dp)
    mu = float(number(conf["proximal-mu"])) if "proximal-mu" in conf else 0.0
    lr = lr_at_round(cfg.lr, server_round, cfg.num_rounds)
    canaries, x, y, owners = audit.client_hook(cfg, cid, x, y, owners, data.num_classes)  # us-audit-canaries > 0 only
    loss_received = audit.canary_losses(model, canaries, device) if canaries is not None else None
    grad_canaries = audit.gradient_hook(cfg, cid, server_round)  # us-audit-canary='gradient' only
    stats = train_local(model, x, y, epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr_for_epoch=lambda e: lr,
                        device=device, seed=client_seed(cfg.seed, server_round, cid), proximal_mu=mu,
                        dp=dp, owners=owners, profiles=data.profiles,
                        channels_last=cfg.channels_last, gradient_canaries=grad_canaries)
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
        assert loss_received is not None  # measured above whenever there are canaries
        content[audit.AUDIT_RECORD] = audit.audit_record(loss_received, audit.canary_losses(model, canaries, device))
    if grad_canaries is not None:
        content[audit.AUDIT_RECORD] = gradient_audit.gradient_record(grad_canaries, stats.steps)
    return Message(content, reply_to=msg)


def _local_only(msg, cfg, cid, model, x, y, owners, data, device, t0, dp) -> Message:
    """Local-only baseline: this client alone, T x E epochs with the same schedule, test after each T-step."""
    curve: list[float] = []
    e_per_round = cfg.local_epochs

    def on_epoch_end(epoch: int, m) -> None:
        if epoch % e_per_round == 0:
            curve.append(evaluate_model(m, data.x["test"], data.y["test"], device)["accuracy"])

    stats = train_local(model, x, y, epochs=cfg.num_rounds * e_per_round, batch_size=cfg.batch_size,
                        lr_for_epoch=lambda e: lr_at_round(cfg.lr, -(-e // e_per_round), cfg.num_rounds),
                        device=device, seed=client_seed(cfg.seed, 0, cid), dp=dp, owners=owners,
                        profiles=data.profiles, on_epoch_end=on_epoch_end, channels_last=cfg.channels_last)
    test = evaluate_model(model, data.x["test"], data.y["test"], device)
    xv, yv = data.client_val_data(cid)
    val = evaluate_model(model, xv, yv, device) if len(yv) else {}
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
