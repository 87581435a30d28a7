"""dfl-dp ClientApp logic: play the logical clients a message names, reply with their models.

``train.dfl_dp``: :func:`train`; ``query.dfl_dp``: :func:`query` (the describe query of a node-local
deployment, flower_apps/common/node_data.py). dfl-dp evaluates centrally: no ``evaluate`` handler.
"""

from __future__ import annotations

import time

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict

from datasets.base import DataError
from datasets.image_plan import build_image_plan
from flower_apps.common.local_training import train_local
from flower_apps.common.node_data import DESCRIBE, describe_reply, error_reply, node_data_path, node_name, query_name
from flower_apps.common.torch_utils import pick_device, record_to_state, state_to_record
from flower_apps.dfl_dp.config import DflDpConfig
from flower_apps.dfl_dp.data import data_key, node_clients
from flower_apps.dfl_dp.victims import capture, victim_clients
from models.seeded_init import seeded_init
from models.small_cnn import build_small_cnn
from registry.streams import seed_int, torch_generator
from strategies.records import array_record, client_key, int_list, number


def _plan(cfg: DflDpConfig, context: Context | None, name: str):
    """(data-path or None, the image plan this node serves): its node-local folder, else the global plan."""
    path = node_data_path(context, cfg.node_local_data)
    return path, build_image_plan(data_key(cfg)) if path is None else node_clients(str(path), name)


def query(msg: Message, context: Context) -> Message:
    """Answer the describe query (``query.dfl_dp``): the clients this node holds, their sizes and label counts."""
    query_name(msg, (DESCRIBE,))  # the only query it answers; any other is refused before any work
    cfg = DflDpConfig.from_json(str(msg.content["config"]["run-config"]))
    name = node_name(context)
    try:
        _, plan = _plan(cfg, context, name)
    except DataError as exc:
        return error_reply(msg, name, exc)
    return describe_reply(msg, name, plan.sizes(), plan.label_counts())


def train(msg: Message, context: Context) -> Message:
    """Train every logical client in ``config['client-ids']``.

    FL: each client starts from the received w(t) and its model is returned.
    Sequential DFL: the clients are links of the chain, in order; each trains the model the
    previous one produced, and only the token after the last one is returned.
    """
    t0 = time.perf_counter()
    cfg = DflDpConfig.from_json(str(msg.content["config"]["run-config"]))
    server_round = int(number(msg.content["config"]["server-round"]))
    # Deployment with node-local data: this node's data-path only, never a global plan.
    name = node_name(context)
    try:
        path, plan = _plan(cfg, context, name)
        client_ids = [int(c) for c in int_list(msg.content["config"]["client-ids"])]
        if path is not None and not set(client_ids) <= set(plan.x):
            raise DataError(f"holds clients {sorted(plan.x)}, asked for {client_ids}")
    except DataError as exc:
        return error_reply(msg, name, exc)
    device = pick_device(cfg.device)
    received = record_to_state(array_record(msg.content["arrays"]))
    c, h, _ = plan.image_shape
    model = build_small_cnn(cfg.seed, c, plan.num_classes, h).to(device)
    model.load_state_dict(received)
    out = RecordDict()
    loss_sum, n_sum = 0.0, 0
    victims = (victim_clients(cfg.seed, cfg.num_clients, cfg.capture_victims)
               if cfg.capture_victims and server_round == cfg.victim_round else [])
    for cid in client_ids:
        if cfg.framework == "fl":
            model.load_state_dict(received)
        x, y = plan.client_data(cid)
        if cid in victims:
            g = torch_generator("clients.sgd", cfg.seed, server_round, cid)
            first = torch.randperm(len(x), generator=g)[: cfg.batch_size]
            capture(out, cid, model, x, y, first, plan.client_indices[cid])
        # dropout masks: the global generators seeded with the client's seed for this call only
        with seeded_init(seed_int("clients.sgd", cfg.seed, server_round, cid), device=device):
            loss, n = train_local(
                model, x, y, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                batch_size=cfg.batch_size, epochs=cfg.local_epochs, grad_clip=cfg.grad_clip,
                generator=torch_generator("clients.sgd", cfg.seed, server_round, cid), device=device,
            )
        loss_sum += loss * n
        n_sum += n
        if cfg.framework == "fl":
            out[client_key(cid)] = state_to_record(model)
    if cfg.framework != "fl":
        out[client_key(client_ids[-1])] = state_to_record(model)
    out["metrics"] = MetricRecord({
        "num-examples": n_sum,
        "train-loss": loss_sum / max(n_sum, 1),
        "client-ids": client_ids,
        "train-seconds": time.perf_counter() - t0,
        "cuda": int(device.type == "cuda"),
    })
    return Message(out, reply_to=msg)


