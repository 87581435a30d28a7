"""tabular-pdp ClientApp logic: one logical client (a Country_Region) per message.

The message type says what the server asks:

* ``train.tabular_pdp`` (:func:`train`): train the received model on the anonymized train split,
  reply with the model;
* ``evaluate.tabular_pdp`` (:func:`evaluate`): reply with error sums of the received model on the
  test split;
* ``query.tabular_pdp`` (:func:`query`), trains nothing; its config's ``query`` names which
  (flower_apps/common/node_data.py: one type, three kinds):

  * ``anonymize``: anjana's k-anonymity search on the client's table (its generalization levels);
    reply with its level vector and suppressed records (or ``status = skipped`` and the reason when
    k is unreachable);
  * ``harmonize``: apply the server's element-wise-maximum levels, suppress classes smaller than
    k, reply with k, l, t (pycanon definitions) and ARIREC;
  * ``describe-node-data`` (node-local deployments): the clients (regions) this node holds.

Everything comes from the message (run config, levels, client id), never from ``context``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import cast

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from datasets.base import DataError
from datasets.cancer import TARGET
from flower_apps.common.node_data import DESCRIBE, describe_reply, error_reply, node_data_path, node_name, query_name
from flower_apps.common.torch_utils import pick_device, record_to_state, state_to_record
from flower_apps.tabular_pdp.config import TabularPdpConfig
from flower_apps.tabular_pdp.data import (
    DataKey,
    anonymized_table,
    client_data,
    client_search,
    client_table,
    data_key,
    model_features,
    node_tables,
    region_of,
)
from flower_apps.tabular_pdp.model import build_model, client_generator, error_sums, train_local
from privacy.anonymization import AnonymizationError, discretize, privacy_metrics, validate_levels
from strategies.records import array_record, int_list, number

SA_COLUMN = "severity_sa"
ANONYMIZE, HARMONIZE = "anonymize", "harmonize"  # its queries besides node_data.DESCRIBE


def _info(cid: int, **extra) -> ConfigRecord:
    return ConfigRecord({"client-id": cid, **extra})


def _anonymize(cfg: TabularPdpConfig, key: DataKey, cid: int, conf: ConfigRecord) -> RecordDict:
    region = region_of(key, cid)
    try:
        n = len(client_table(key, cid))
        res = client_search(key, cid, cfg.k, cfg.suppression)
    except (AnonymizationError, ValueError) as exc:
        return RecordDict({"info": _info(cid, status="skipped", reason=str(exc), region=region)})
    return RecordDict({"info": _info(cid, status="ok", region=region),
                       "metrics": MetricRecord({"levels": list(res.levels), "suppressed": res.suppressed,
                                                "n-records": n})})


def _harmonize(cfg: TabularPdpConfig, key: DataKey, cid: int, conf: ConfigRecord) -> RecordDict:
    levels = validate_levels([int(v) for v in int_list(conf["levels"])])
    n = len(client_table(key, cid))
    table, suppressed = anonymized_table(key, cid, levels, cfg.k)
    region = region_of(key, cid)
    if suppressed > cfg.suppression * n or len(table) < 2:
        return RecordDict({"info": _info(cid, status="skipped", region=region,
                                         reason=f"levels {list(levels)} suppress {suppressed} of {n} records, more "
                                                f"than tab-suppression={cfg.suppression:g}")})
    data = table.assign(**{SA_COLUMN: discretize(table[TARGET].to_numpy(), cfg.sa_bin_width)})
    m = privacy_metrics(data, SA_COLUMN)
    return RecordDict({"info": _info(cid, status="ok", region=region),
                       "metrics": MetricRecord({**{k.replace("_", "-"): v for k, v in m.items()},
                                                "suppressed": suppressed, "n-original": n})})


def _data(cfg: TabularPdpConfig, key: DataKey, cid: int, conf: ConfigRecord):
    levels = validate_levels([int(v) for v in int_list(conf["levels"])])
    poisoned = cfg.poison != "none" and cid == cfg.poison_client
    d = client_data(key, cid, levels, cfg.k, cfg.features, cfg.test_fraction, cfg.seed,
                    cfg.poison if poisoned else "none", cfg.poison_scale)
    return d, len(model_features(cfg.features, levels))


def _fit(cfg: TabularPdpConfig, key: DataKey, cid: int, msg: Message) -> RecordDict:
    conf = cast(ConfigRecord, msg.content["config"])  # typing only: a RecordDict item is any record
    d, in_features = _data(cfg, key, cid, conf)
    device = pick_device(cfg.device)
    model = build_model(cfg.seed, in_features)
    model.load_state_dict(record_to_state(array_record(msg.content["arrays"])))
    model.to(device)
    server_round = int(number(conf["server-round"]))
    loss = train_local(model, d.x_train, d.y_train, lr=cfg.lr, batch_size=cfg.batch_size, epochs=cfg.local_epochs,
                       generator=client_generator(cfg.seed, server_round, cid), device=device)
    return RecordDict({"arrays": state_to_record(model),
                       "metrics": MetricRecord({"num-examples": int(len(d.y_train)), "train-loss": loss}),
                       "info": _info(cid)})


def _evaluate(cfg: TabularPdpConfig, key: DataKey, cid: int, msg: Message) -> RecordDict:
    d, in_features = _data(cfg, key, cid, cast(ConfigRecord, msg.content["config"]))
    device = pick_device(cfg.device)
    model = build_model(cfg.seed, in_features)
    model.load_state_dict(record_to_state(array_record(msg.content["arrays"])))
    model.to(device)
    return RecordDict({"metrics": MetricRecord(error_sums(model, d.x_test, d.y_test, device)), "info": _info(cid)})


def _answer(msg: Message, context: Context, kind: str) -> Message:
    """Answer one message for the logical client named in ``config['client-ids']`` (exactly one).

    ``kind``: ``fit`` (train), ``evaluate``, or a query's name (``anonymize``, ``harmonize``, ``describe-node-data``).
    """
    t0 = time.perf_counter()
    conf = cast(ConfigRecord, msg.content["config"])  # typing only: a RecordDict item is any record
    cfg = TabularPdpConfig.from_json(str(conf["run-config"]))
    # Deployment with node-local data: this node's data-path only (flower_apps/common/node_data.py).
    name = node_name(context)
    try:
        path = node_data_path(context, cfg.node_local_data)
        key = data_key(cfg) if path is None else replace(data_key(cfg), node_path=str(path), node=name)
        if kind == DESCRIBE:
            return describe_reply(msg, name, {c: len(t) for c, t in node_tables(key.node_path, name).items()})
    except DataError as exc:
        return error_reply(msg, name, exc)
    ids = [int(c) for c in int_list(conf["client-ids"])]
    if len(ids) != 1:
        raise ValueError(f"tabular-pdp plays one logical client per message, got {ids}")
    torch.set_num_threads(1)  # a 17k-parameter MLP: more threads only contend for the cores
    try:
        if path is not None:
            client_table(key, ids[0])  # a node's missing/malformed table fails here, as an error reply naming it
    except DataError as exc:
        return error_reply(msg, name, exc)
    if kind == ANONYMIZE:
        content = _anonymize(cfg, key, ids[0], conf)
    elif kind == HARMONIZE:
        content = _harmonize(cfg, key, ids[0], conf)
    elif kind == "fit":
        content = _fit(cfg, key, ids[0], msg)
    else:
        content = _evaluate(cfg, key, ids[0], msg)
    cast(ConfigRecord, content["info"])["seconds"] = time.perf_counter() - t0  # _info: a ConfigRecord
    return Message(content, reply_to=msg)


def train(msg: Message, context: Context) -> Message:
    """``train.tabular_pdp``: one local fit of the received model; reply with the model."""
    return _answer(msg, context, "fit")


def evaluate(msg: Message, context: Context) -> Message:
    """``evaluate.tabular_pdp``: error sums of the received model on the client's test split."""
    return _answer(msg, context, "evaluate")


def query(msg: Message, context: Context) -> Message:
    """``query.tabular_pdp``: anonymize, harmonize or describe-node-data (the config's ``query``)."""
    return _answer(msg, context, query_name(msg, (ANONYMIZE, HARMONIZE, DESCRIBE)))
