"""unlinkable-dfl ClientApp: each logical node's learner (train + fragment, then aggregate its pool).

``train.unlinkable_dfl`` (:func:`train`), two steps named by ``config['phase']`` (one message type,
two kinds: both make the node's new model, so both are Flower train messages):

* ``train``: for every node in ``client-ids`` (the logical nodes this SuperNode plays) load its current model (``client.<id>``),
  train on its Dirichlet shard, flatten the shareable state, fragment and encode it,
  and pick ``(destination, fragment)`` pairs among the neighbours given in
  ``peers.<id>`` (selective transmission, ratio r). Reply: the trained model
  (``client.<id>``), the encoded fragments and the chosen sends (``frags.<id>``), metrics.
* ``aggregate``: for every node, pool its trained model with the fragments its inbox
  received (``inbox.<id>``, anonymous bytes), run FragFedAvg/FragKrum, evaluate the result.
  Reply: the new model (``client.<id>``) and metrics (``metrics.<id>``).

Everything comes from the message (run config as JSON, models, fragments); nothing from
``context.run_config`` or ``context.state``: the node's memory between phases is held
by the ServerApp, which plays the world (see docs/unlinkable_dfl.md).

Deployment (``node-local-data = true``): local training is the only step that touches training
data and it runs here, so a SuperNode trains on its ``data-path`` shards and nothing else
(:func:`flower_apps.unlinkable_dfl.data.node_shards`); it answers the server's describe query
(``query.unlinkable_dfl``, :func:`query`) with the logical nodes it holds. The aggregate phase then
does not evaluate: the coordinator evaluates every node's model on its ``eval-data-path`` (a SuperNode
holds no test set).
"""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from datasets.base import DataError
from flower_apps.common.node_data import DESCRIBE, describe_reply, error_reply, node_data_path, node_name, query_name
from flower_apps.common.torch_utils import record_to_state, state_to_record
from flower_apps.unlinkable_dfl.config import UdflConfig
from flower_apps.unlinkable_dfl.data import build_data_plan, data_key, node_shards
from flower_apps.unlinkable_dfl.models import build_model, load_vector, shareable_keys, state_vector
from flower_apps.unlinkable_dfl.node import (
    aggregate,
    choose_sends,
    corrupt,
    encode_state,
    fragment_layout,
    node_generator,
    torch_generator,
    train_local,
)
from flower_apps.unlinkable_dfl.node import evaluate as evaluate_model  # not a handler: no evaluate.unlinkable_dfl
from strategies.cohorts import client_ids_of
from strategies.records import array_record, client_key, int_list, number

STREAM_QUANT, STREAM_SENDS, STREAM_BYZ = "unlinkable-dfl.quantization", "unlinkable-dfl.sends", "unlinkable-dfl.byzantine-values"


def _model_for(cfg: UdflConfig, plan):
    c, h, _ = plan.image_shape
    return build_model(cfg.model, cfg.seed, c, plan.num_classes, h)


def _plan(cfg: UdflConfig, context: Context | None, name: str):
    """(data-path or None, the data this node serves): its node-local shards, else the global plan."""
    path = node_data_path(context, cfg.node_local_data)
    return path, build_data_plan(data_key(cfg)) if path is None else node_shards(str(path), name)


def query(msg: Message, context: Context) -> Message:
    """Answer the describe query (``query.unlinkable_dfl``): the logical nodes this SuperNode holds."""
    query_name(msg, (DESCRIBE,))  # the only query it answers; any other is refused before any work
    cfg = UdflConfig.from_json(str(msg.content["config"]["run-config"]))
    name = node_name(context)
    try:
        _, plan = _plan(cfg, context, name)
    except DataError as exc:
        return error_reply(msg, name, exc)
    return describe_reply(msg, name, plan.sizes(), plan.label_counts())


def train(msg: Message, context: Context) -> Message:
    """Dispatch on the step (``phase``) named in the message."""
    conf = cast(ConfigRecord, msg.content["config"])  # a RecordDict item is typed as any record
    cfg = UdflConfig.from_json(str(conf["run-config"]))
    name = node_name(context)
    try:  # deployment: this node's data-path only, never the global partition
        path, plan = _plan(cfg, context, name)
        if path is not None and not set(client_ids_of(conf)) <= set(plan.x):
            raise DataError(f"holds nodes {sorted(plan.x)}, asked for {client_ids_of(conf)}")
    except DataError as exc:
        return error_reply(msg, name, exc)
    phase = str(conf["phase"])
    if phase == "train":
        out = _train_phase(cfg, plan, msg.content, int(number(conf["server-round"])))
    elif phase == "aggregate":
        out = _aggregate_phase(cfg, plan, msg.content, int(number(conf["server-round"])))
    else:
        raise ValueError(f"phase must be 'train' or 'aggregate', got {phase!r}")
    return Message(out, reply_to=msg)


def _train_phase(cfg: UdflConfig, plan, content: RecordDict, round_: int) -> RecordDict:
    conf = cast(ConfigRecord, content["config"])
    byzantine = {int(i) for i in int_list(conf.get("byzantine-ids", []))}
    out = RecordDict()
    for node in client_ids_of(conf):
        t0, c0 = time.perf_counter(), time.process_time()
        model = _model_for(cfg, plan)
        model.load_state_dict(record_to_state(array_record(content[client_key(node)])))
        x, y = plan.node_data(node)
        loss, seen = train_local(model, x, y, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                                 batch_size=cfg.batch_size, epochs=cfg.local_epochs,
                                 generator=torch_generator(cfg.seed, round_, node))
        train_cpu = time.process_time() - c0
        c1 = time.process_time()
        keys = shareable_keys(model)
        vector = state_vector(model.state_dict(), keys)
        shared = vector
        if node in byzantine:
            shared = corrupt(vector, cfg.byzantine_attack, cfg.byzantine_scale,
                             node_generator(cfg.seed, round_, node, STREAM_BYZ))
        layout = fragment_layout(len(vector), cfg.payload_size, cfg.encoding)
        diverged = not np.isfinite(shared).all()
        # A model driven to inf/NaN (e.g. FragFedAvg under Byzantine fragments) has nothing valid to
        # share: the node sends no fragments this round (and its accuracy shows the damage).
        fragments = [] if diverged else encode_state(shared, layout, round_, cfg.encoding,
                                                     node_generator(cfg.seed, round_, node, STREAM_QUANT))
        peers = [] if diverged else [int(p) for p in int_list(conf.get(f"peers.{node}", []))]
        share = 1.0 if cfg.mode == "baseline" else cfg.share_ratio
        sends = choose_sends(peers, layout.count, share, node_generator(cfg.seed, round_, node, STREAM_SENDS)) \
            if peers else []
        out[client_key(node)] = state_to_record(model)
        out[f"frags.{node}"] = ConfigRecord({"fragments": fragments, "dst": [d for d, _ in sends],
                                             "idx": [i for _, i in sends]})
        out[f"metrics.{node}"] = MetricRecord({
            "train-loss": loss, "num-examples": seen, "train-cpu-s": train_cpu,
            "encode-cpu-s": time.process_time() - c1, "train-wall-s": time.perf_counter() - t0,
            "num-fragments": layout.count, "diverged": int(diverged),
        })
    return out


def _aggregate_phase(cfg: UdflConfig, plan, content: RecordDict, round_: int) -> RecordDict:
    conf = cast(ConfigRecord, content["config"])
    # node-local: no test set on the node; the coordinator evaluates the returned model (server_app)
    x_test: Any  # both None (node-local) or both tensors: mypy cannot tie y_test's None to x_test's
    y_test: Any
    x_test, y_test = (None, None) if cfg.node_local_data else plan.test_subset(cfg.eval_samples)
    out = RecordDict()
    for node in client_ids_of(conf):
        c0, t0 = time.process_time(), time.perf_counter()
        model = _model_for(cfg, plan)
        state = record_to_state(array_record(content[client_key(node)]))
        keys = shareable_keys(model)
        local = state_vector(state, keys)
        layout = fragment_layout(len(local), cfg.payload_size, cfg.encoding)
        inbox = cast(ConfigRecord, content[f"inbox.{node}"])
        payloads = [bytes(b) for b in cast("list[bytes]", inbox["fragments"])] if "fragments" in inbox else []
        vector, stats = aggregate(local, layout, round_, payloads, cfg.aggregator, cfg.krum_budget,
                                  cfg.krum_fallback)
        model.load_state_dict(load_vector(state, keys, vector))
        agg_cpu = time.process_time() - c0
        acc, loss = evaluate_model(model, x_test, y_test) if x_test is not None else (float("nan"), float("nan"))
        out[client_key(node)] = state_to_record(model)
        out[f"metrics.{node}"] = MetricRecord({
            "test-acc": acc, "test-loss": loss, "aggregate-cpu-s": agg_cpu,
            "aggregate-wall-s": time.perf_counter() - t0,
            **{k.replace("_", "-"): float(v) for k, v in stats.as_dict().items()},
        })
    return out
