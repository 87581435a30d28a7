"""tabular-pdp ClientApp logic: one logical client (a Country_Region) per message, four phases.

``config['phase']`` says what the server asks:

* ``anonymize``: anjana's k-anonymity search on the client's table; reply with its level vector
  and suppressed records (or ``status = skipped`` and the reason when k is unreachable);
* ``harmonize``: apply the server's element-wise-maximum levels, suppress classes smaller than
  k, reply with k, l, t (pycanon definitions) and ARIREC;
* ``fit``: train the received model on the anonymized train split, reply with the model;
* ``evaluate``: reply with error sums of the received model on the test split.

Everything comes from the message (run config, levels, client id), never from ``context``.
"""

from __future__ import annotations

import time

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from datasets.cancer import TARGET
from flower_apps.common.torch_utils import pick_device, record_to_state, state_to_record
from flower_apps.tabular_pdp.config import TabularPdpConfig
from flower_apps.tabular_pdp.data import (anonymized_table, client_data, client_search, client_table, data_key,
                                          model_features, regions)
from flower_apps.tabular_pdp.model import build_model, client_generator, error_sums, train_local
from privacy.anonymization import AnonymizationError, discretize, privacy_metrics, validate_levels

SA_COLUMN = "severity_sa"


def _info(cid: int, **extra) -> ConfigRecord:
    return ConfigRecord({"client-id": cid, **extra})


def _anonymize(cfg: TabularPdpConfig, cid: int, conf: ConfigRecord) -> RecordDict:
    key = data_key(cfg)
    region = regions(key)[cid] if cid < len(regions(key)) else ""
    try:
        n = len(client_table(key, cid))
        res = client_search(key, cid, cfg.k, cfg.suppression)
    except (AnonymizationError, ValueError) as exc:
        return RecordDict({"info": _info(cid, status="skipped", reason=str(exc), region=region)})
    return RecordDict({"info": _info(cid, status="ok", region=region),
                       "metrics": MetricRecord({"levels": list(res.levels), "suppressed": res.suppressed,
                                                "n-records": n})})


def _harmonize(cfg: TabularPdpConfig, cid: int, conf: ConfigRecord) -> RecordDict:
    key = data_key(cfg)
    levels = validate_levels([int(v) for v in conf["levels"]])
    n = len(client_table(key, cid))
    table, suppressed = anonymized_table(key, cid, levels, cfg.k)
    region = regions(key)[cid]
    if suppressed > cfg.suppression * n or len(table) < 2:
        return RecordDict({"info": _info(cid, status="skipped", region=region,
                                         reason=f"levels {list(levels)} suppress {suppressed} of {n} records, more "
                                                f"than tab-suppression={cfg.suppression:g}")})
    data = table.assign(**{SA_COLUMN: discretize(table[TARGET].to_numpy(), cfg.sa_bin_width)})
    m = privacy_metrics(data, SA_COLUMN)
    return RecordDict({"info": _info(cid, status="ok", region=region),
                       "metrics": MetricRecord({**{k.replace("_", "-"): v for k, v in m.items()},
                                                "suppressed": suppressed, "n-original": n})})


def _data(cfg: TabularPdpConfig, cid: int, conf: ConfigRecord):
    levels = validate_levels([int(v) for v in conf["levels"]])
    poisoned = cfg.poison != "none" and cid == cfg.poison_client
    d = client_data(data_key(cfg), cid, levels, cfg.k, cfg.features, cfg.test_fraction, cfg.seed,
                    cfg.poison if poisoned else "none", cfg.poison_scale)
    return d, len(model_features(cfg.features, levels))


def _fit(cfg: TabularPdpConfig, cid: int, msg: Message) -> RecordDict:
    conf = msg.content["config"]
    d, in_features = _data(cfg, cid, conf)
    device = pick_device(cfg.device)
    model = build_model(cfg.seed, in_features)
    model.load_state_dict(record_to_state(msg.content["arrays"]))
    model.to(device)
    server_round = int(conf["server-round"])
    loss = train_local(model, d.x_train, d.y_train, lr=cfg.lr, batch_size=cfg.batch_size, epochs=cfg.local_epochs,
                       generator=client_generator(cfg.seed, server_round, cid), device=device)
    return RecordDict({"arrays": state_to_record(model),
                       "metrics": MetricRecord({"num-examples": int(len(d.y_train)), "train-loss": loss}),
                       "info": _info(cid)})


def _evaluate(cfg: TabularPdpConfig, cid: int, msg: Message) -> RecordDict:
    d, in_features = _data(cfg, cid, msg.content["config"])
    device = pick_device(cfg.device)
    model = build_model(cfg.seed, in_features)
    model.load_state_dict(record_to_state(msg.content["arrays"]))
    model.to(device)
    return RecordDict({"metrics": MetricRecord(error_sums(model, d.x_test, d.y_test, device)), "info": _info(cid)})


def train(msg: Message, context: Context) -> Message:
    """Answer one phase for the logical client named in ``config['client-ids']`` (exactly one)."""
    t0 = time.perf_counter()
    conf = msg.content["config"]
    cfg = TabularPdpConfig.from_json(str(conf["run-config"]))
    ids = [int(c) for c in conf["client-ids"]]
    if len(ids) != 1:
        raise ValueError(f"tabular-pdp plays one logical client per message, got {ids}")
    torch.set_num_threads(1)  # a 17k-parameter MLP: more threads only contend for the cores
    phase = str(conf["phase"])
    if phase == "anonymize":
        content = _anonymize(cfg, ids[0], conf)
    elif phase == "harmonize":
        content = _harmonize(cfg, ids[0], conf)
    elif phase == "fit":
        content = _fit(cfg, ids[0], msg)
    elif phase == "evaluate":
        content = _evaluate(cfg, ids[0], msg)
    else:
        raise ValueError(f"unknown phase {phase!r}; allowed: anonymize, harmonize, fit, evaluate")
    content["info"]["seconds"] = time.perf_counter() - t0
    return Message(content, reply_to=msg)
