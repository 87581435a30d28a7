"""Example study C (issue 38): sequential (token-passing) DFL on Fashion-MNIST with a small MLP.

The whole study: its keys, presets, config, data, model, ServerApp and ClientApp logic, report card
and spec. Registration is one line (``flower_apps.studies.register_study(SPEC)``, or ``registered``
for a test). Built only from shared pieces; see docs/architecture.md, "How to add a study".
"""

from __future__ import annotations

import json
from dataclasses import asdict

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from datasets.partition import partition
from datasets.registry import load_dataset
from flower_apps.common.local_training import evaluate, train_local
from flower_apps.common.report_card import summary_card
from flower_apps.common.run_record import RunRecord
from flower_apps.common.torch_utils import record_to_state, state_to_record
from flower_apps.config import COMMON_KEYS, SHARED_KEYS, Key, KeyTable, StudySpec
from models.seeded_init import seeded_init
from registry import streams
from strategies.cohorts import client_ids_of, config_record, wait_for_nodes
from strategies.observer import RoundObserver
from strategies.records import client_key
from strategies.registry import build_strategy

STUDY, ACTION = "example-seq-dfl", "example_seq_dfl"
KEYS = KeyTable(STUDY, (
    COMMON_KEYS["dataset"].refine(choices=("fashion-mnist", "mnist-5k")), SHARED_KEYS["lr"],
    SHARED_KEYS["batch-size"], SHARED_KEYS["local-epochs"], SHARED_KEYS["clients-per-message"],
    SHARED_KEYS["dirichlet-alpha"], Key("exc-hidden", 64, int, ge=1, doc="hidden units of the MLP (example C)"),
))
PRESETS = {"smoke": {"dataset": "fashion-mnist", "data-fraction": 0.05, "num-clients": 6, "num-rounds": 2,
                     "clients-per-message": 3, "lr": 0.05, "batch-size": 32}}
SeqDflRun = KEYS.config_class("SeqDflRun", run_name=("dirichlet-alpha",))
SUBSET = streams.register(streams.Stream(f"{STUDY}.subset", ("seed", 1), doc="data-fraction subsample"))  # registry.streams


def to_json(cfg: SeqDflRun) -> str:
    return json.dumps(asdict(cfg), sort_keys=True)


_DATA: dict[str, tuple] = {}  # per process (a ClientApp worker serves many messages of one run)


def data(cfg_json: str) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """Dirichlet label-skewed clients of a fixed-seed subset of the training images, and 2,000 test images."""
    if cfg_json not in _DATA:
        _DATA.clear()
        _DATA[cfg_json] = _load(SeqDflRun(**json.loads(cfg_json)))
    return _DATA[cfg_json]


def _load(cfg: SeqDflRun) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    ds = load_dataset(cfg.dataset, cfg.data_dir or None)  # DataError names missing files, before any work
    keep = streams.rng(SUBSET.name, cfg.seed).permutation(len(ds.y_train))[: int(len(ds.y_train) * cfg.data_fraction)]
    x, y = torch.tensor(ds.x_train[keep], dtype=torch.float32).flatten(1) / 255, torch.tensor(ds.y_train[keep])
    parts = partition("dirichlet", y.numpy(), cfg.num_clients, cfg.seed, alpha=cfg.dirichlet_alpha)
    xt = torch.tensor(ds.x_test[:2000], dtype=torch.float32).flatten(1) / 255
    return [(x[p], y[p].long()) for p in parts], xt, torch.tensor(ds.y_test[:2000]).long()


def model_for(cfg: SeqDflRun) -> torch.nn.Module:
    with seeded_init(cfg.seed):  # seeded initial weights; torch's global generator is left as it was
        return torch.nn.Sequential(torch.nn.Linear(784, cfg.exc_hidden), torch.nn.ReLU(),
                                   torch.nn.Linear(cfg.exc_hidden, 10))


def server_main(grid: Grid, cfg: SeqDflRun) -> dict:
    """Relay the token along the chain for cfg.num_rounds rounds; evaluate it after each round."""
    _, x_test, y_test = data(to_json(cfg))
    model = model_for(cfg)
    strategy = build_strategy("sequential-dfl", list(range(cfg.num_clients)), ACTION, cfg.clients_per_message)
    with RunRecord(STUDY, cfg) as run:
        wait_for_nodes(grid, 1)

        def keep_round(server_round: int, arrays, metrics: MetricRecord | None) -> None:
            if arrays is not None:
                model.load_state_dict(record_to_state(arrays))
            acc, loss = evaluate(model, x_test, y_test)
            run.round({"round": server_round, "test_acc": acc, "test_loss": loss})

        RoundObserver(strategy, on_result=keep_round).start(
            grid, state_to_record(model), num_rounds=cfg.num_rounds, timeout=cfg.round_timeout,
            train_config=config_record(asdict(cfg)))
        return run.finish({"final_acc": run.rounds[-1]["test_acc"]})


def train(msg: Message, context: Context) -> Message:
    """The clients of ``client-ids`` are links of the chain, in order; reply the token after the last."""
    conf = msg.content["config"]
    cfg = SeqDflRun(**json.loads(str(conf["run-config"])))
    parts, _, _ = data(to_json(cfg))
    model = model_for(cfg)
    model.load_state_dict(record_to_state(msg.content["arrays"]))
    ids, n_sum, loss_sum = client_ids_of(conf), 0, 0.0
    for cid in ids:
        g = streams.torch_generator("clients.sgd", cfg.seed, int(conf["server-round"]), cid)
        loss, n = train_local(model, *parts[cid], lr=cfg.lr, momentum=0.0, weight_decay=0.0, batch_size=cfg.batch_size,
                              epochs=cfg.local_epochs, generator=g)
        n_sum, loss_sum = n_sum + n, loss_sum + loss * n
    out = RecordDict({client_key(ids[-1]): state_to_record(model), "metrics": MetricRecord(
        {"num-examples": n_sum, "train-loss": loss_sum / n_sum, "client-ids": ids})})
    return Message(out, reply_to=msg)


SPEC = StudySpec(STUDY, ACTION, KEYS, PRESETS, lambda c: KEYS.build(SeqDflRun, c), server_main, train,
                 card=summary_card(STUDY))
