"""A minimal fifth study, built only from the shared pieces: FedAvg with matched perturbation.

docs/architecture.md ("How to add a study") walks through it; tests/flower_apps/test_example_study.py
registers it and runs it through the router and Flower's simulation, as ``flwr run`` would.
IID clients of an image dataset, a softmax-regression model, FL with Algorithm 1's clipping and
calibrated Gaussian noise (strategies.registry), central test accuracy per round.
A built-in study splits the same parts over ``study.py``, ``config.py``, ``server_app.py`` and
``client_app.py`` (see flower_apps.studies); one module is enough for a fixture.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from datasets.partition import partition
from datasets.registry import DATASETS, load_dataset
from flower_apps.common.local_training import evaluate, train_local
from flower_apps.common.run_record import RunRecord
from flower_apps.common.torch_utils import record_to_state, state_to_record
from flower_apps.config import COMMON_KEYS, SHARED_KEYS, Key, KeyTable, StudySpec, noise_condition
from models.seeded_init import seeded_init
from privacy.randomness import NoiseSource
from registry import streams
from strategies.cohorts import client_ids_of, config_record, wait_for_nodes
from strategies.matched_perturbation import MatchedPerturbation
from strategies.observer import RoundObserver
from strategies.records import array_record, client_key, config_of, number
from strategies.registry import build_strategy

STUDY, ACTION = "example-minimal", "example_minimal"
KEYS = KeyTable(STUDY, (
    COMMON_KEYS["dataset"].refine(choices=DATASETS),
    SHARED_KEYS["lr"], SHARED_KEYS["batch-size"], SHARED_KEYS["local-epochs"], SHARED_KEYS["clients-per-message"],
    Key("ex-clip-norm", 1.0, float, gt=0, doc="C: L2 clipping norm of each client update (example study)"),
    Key("ex-eps-cal", 4.0, float, gt=0, doc="epsilon that calibrates sigma_abs (example study)"),
))
PRESETS = {"paper": {}, "smoke": {"dataset": "mnist-5k", "num-clients": 4, "num-rounds": 2, "data-fraction": 0.2,
                                  "clients-per-message": 2}}


#: One run's settings: a field per key of the table above (KeyTable.config_class); the run folder is
#: ``<results-dir>/example-minimal/runs/<preset>_ex-eps-cal<value>_s<seed>`` unless ``run-name`` is set.
if TYPE_CHECKING:  # the type checker's view of the derived class (scripts/sync_run_keys.py writes it)
    from flower_apps.example_minimal_fields import ExampleConfigFields as ExampleConfig
else:
    ExampleConfig = KEYS.config_class("ExampleConfig", run_name=("ex-eps-cal",))


def build_config(c: dict) -> ExampleConfig:
    """Single-key checks come from the table; this study has no cross-field rule."""
    return KEYS.build(ExampleConfig, c)


@lru_cache(maxsize=2)
def client_data(cfg_json: str) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """Per-client (x, y) of an IID split of the training images, and the test set (cached per process)."""
    cfg = ExampleConfig(**json.loads(cfg_json))
    ds = load_dataset(cfg.dataset, cfg.data_dir or None)
    order = streams.rng("example-minimal.subsample", cfg.seed).permutation(len(ds.y_train))
    keep = order[: int(len(ds.y_train) * cfg.data_fraction)]
    x = torch.tensor(ds.x_train[keep], dtype=torch.float32).flatten(1) / 255.0
    y = torch.tensor(ds.y_train[keep], dtype=torch.long)
    n_test = max(1, len(y) // 5)  # the last fifth of the kept (shuffled) images is the server's test set
    parts = partition("iid", y[:-n_test].numpy(), cfg.num_clients, cfg.seed)
    return [(x[p], y[p]) for p in parts], x[-n_test:], y[-n_test:]


def to_json(cfg: ExampleConfig) -> str:
    return json.dumps(asdict(cfg), sort_keys=True)


def model_for(cfg: ExampleConfig, x: torch.Tensor) -> torch.nn.Module:
    with seeded_init(cfg.seed):  # w(0) per seed; torch's global random state untouched
        return torch.nn.Linear(x.shape[1], 10)


def server_main(grid: Grid, cfg: ExampleConfig) -> dict:
    """One run: validate data, train cfg.num_rounds FL rounds with matched perturbation, write results."""
    parts, x_test, y_test = client_data(to_json(cfg))  # fails here, before any folder or message
    model = model_for(cfg, x_test)
    strategy = build_strategy("fl", list(range(cfg.num_clients)), ACTION, cfg.clients_per_message, dp=True,
                              clip_norm=cfg.ex_clip_norm, eps_cal=cfg.ex_eps_cal,
                              noise=NoiseSource(cfg.noise_seed_file, noise_condition(cfg)), stream=(cfg.seed,))
    assert isinstance(strategy, MatchedPerturbation)  # dp=True: FedAvg inside the matched clip-and-noise wrapper
    # The run folder as the built-in studies open it: a finished run or another config's folder is refused,
    # a second ServerApp on the same folder is locked out (flower_apps.common.run_record).
    with RunRecord(STUDY, cfg) as run:
        wait_for_nodes(grid, 1)

        def keep_round(server_round: int, arrays, metrics: MetricRecord | None) -> None:
            if arrays is not None:
                model.load_state_dict(record_to_state(arrays))
            acc, loss = evaluate(model, x_test, y_test)
            run.round({"round": server_round, "test_acc": acc, "test_loss": loss,
                       **{k.replace("-", "_"): v for k, v in (metrics or {}).items()}})

        RoundObserver(strategy, on_result=keep_round).start(
            grid, state_to_record(model), num_rounds=cfg.num_rounds, timeout=cfg.round_timeout,
            train_config=config_record(asdict(cfg)))
        return run.finish({"final_acc": run.rounds[-1]["test_acc"], "rounds": len(run.rounds),
                           **strategy.noise.describe(), **strategy.clip_summary()})


def train(msg: Message, context: Context) -> Message:
    """Train each logical client the message names from the received model; reply one model each."""
    conf = config_of(msg.content["config"])
    cfg = ExampleConfig(**json.loads(str(conf["run-config"])))
    parts, x_test, _ = client_data(to_json(cfg))
    out, n_sum, loss_sum = RecordDict(), 0, 0.0
    for cid in client_ids_of(conf):
        model = model_for(cfg, x_test)
        model.load_state_dict(record_to_state(array_record(msg.content["arrays"])))
        x, y = parts[cid]
        loss, n = train_local(model, x, y, lr=cfg.lr, momentum=0.0, weight_decay=0.0, batch_size=cfg.batch_size,
                           epochs=cfg.local_epochs,
                           generator=streams.torch_generator("clients.sgd", cfg.seed, int(number(conf["server-round"])), cid))
        out[client_key(cid)] = state_to_record(model)
        n_sum, loss_sum = n_sum + n, loss_sum + loss * n
    out["metrics"] = MetricRecord({"num-examples": n_sum, "train-loss": loss_sum / max(n_sum, 1),
                                   "client-ids": client_ids_of(conf)})
    return Message(out, reply_to=msg)


SPEC = StudySpec(STUDY, ACTION, KEYS, PRESETS, build_config, server_main, train)
