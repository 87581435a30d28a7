"""Example study B (issue 38): FedProx over the cancer-patients table, one client per country, with
server-side Gaussian DP (clip each update to C, add N(0, (z C / m)^2) to the aggregate), linear regression
of the severity score.

Threat model: the server is trusted; the noise hides each client's update from the other clients and from
anyone who sees the released models. Its randomness is the server's own (OS entropy, or the server's local
noise-seed-file), never the run seed. The accountant reads sigma from the configured z, C and the valid cohort.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedProx

from datasets.base import DataError
from datasets.cancer import RISK_FACTORS, TARGET, load_cancer
from flower_apps.common.report_card import summary_card
from flower_apps.common.run_record import RunRecord
from flower_apps.common.torch_utils import record_to_state, state_to_record
from flower_apps.config import COMMON_KEYS, SHARED_KEYS, Key, KeyTable, StudySpec, noise_condition
from models.seeded_init import seeded_init
from privacy.randomness import NoiseSource
from privacy.tabular_accounting import client_budgets
from registry import streams
from strategies.cohorts import client_ids_of, config_record, wait_for_nodes
from strategies.fixed_cohort import FixedCohort
from strategies.server_fixed_clipping import ServerSideFixedClipping

STUDY, ACTION = "example-fedprox-gdp", "example_fedprox_gdp"
KEYS = KeyTable(STUDY, (
    COMMON_KEYS["dataset"].refine(choices=("cancer-synthetic", "cancer-csv")), SHARED_KEYS["lr"],
    SHARED_KEYS["batch-size"], SHARED_KEYS["local-epochs"], SHARED_KEYS["delta-total"],
    Key("exb-mu", 0.1, float, ge=0, doc="FedProx proximal term mu (example B)"),
    Key("exb-clip-norm", 0.5, float, gt=0, doc="C: server-side clip of each client update (example B)"),
    Key("exb-noise-multiplier", 1.0, float, ge=0, doc="z: noise SD z C / m on the aggregate (example B)"),
))
PRESETS = {"smoke": {"dataset": "cancer-synthetic", "num-clients": 10, "num-rounds": 3, "lr": 0.05, "batch-size": 64,
                     "data-fraction": 0.1}}
FedProxRun = KEYS.config_class("FedProxRun", run_name=("exb-mu", "exb-noise-multiplier"))
FEATURES = (*RISK_FACTORS, "Age")
SPLIT = streams.register(streams.Stream(f"{STUDY}.split", ("seed", 1), doc="test rows"))  # this study's random stream
STREAM_NOISE = 0xE8B  # its server's DP noise stream (privacy.randomness, secret)
_DATA: dict[str, tuple] = {}


def data(cfg: FedProxRun) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """Standardized features and score; clients = countries (the first num-clients); a 20% test set."""
    key = json.dumps(asdict(cfg), sort_keys=True)
    if key not in _DATA:
        df, _ = load_cancer(cfg.dataset, cfg.data_dir)  # DataError names the file or column, before any work
        df = df.sample(frac=cfg.data_fraction, random_state=cfg.seed).reset_index(drop=True)
        x = torch.tensor(((df[list(FEATURES)] - df[list(FEATURES)].mean()) / df[list(FEATURES)].std()).to_numpy(),
                         dtype=torch.float32)
        y = torch.tensor(df[TARGET].to_numpy(), dtype=torch.float32)[:, None]
        test = streams.rng(SPLIT.name, cfg.seed).random(len(df)) < 0.2
        countries = sorted(df["Country_Region"].unique())[: cfg.num_clients]
        if len(countries) < cfg.num_clients:
            raise DataError(f"num-clients {cfg.num_clients}: the table has {len(countries)} countries (one client each)")
        parts = [np.flatnonzero((df["Country_Region"] == c).to_numpy() & ~test) for c in countries]
        _DATA.clear()
        _DATA[key] = ([(x[p], y[p]) for p in parts], x[test], y[test])
    return _DATA[key]


def model_for(cfg: FedProxRun) -> torch.nn.Module:
    with seeded_init(cfg.seed):
        return torch.nn.Linear(len(FEATURES), 1)


class CohortFedProx(FixedCohort, FedProx):
    """Flower's FedProx (size-weighted mean, proximal-mu in the train config) over named clients."""

    def __init__(self, client_ids: list[int], mu: float) -> None:
        FedProx.__init__(self, proximal_mu=mu, fraction_evaluate=0.0)
        self.set_cohort(client_ids, ACTION)


def server_main(grid: Grid, cfg: FedProxRun) -> dict:
    parts, x_test, y_test = data(cfg)
    model = model_for(cfg)
    base = CohortFedProx(list(range(len(parts))), cfg.exb_mu)
    rng = NoiseSource(cfg.noise_seed_file, noise_condition(cfg)).numpy_generator(STREAM_NOISE, cfg.seed)
    dp = ServerSideFixedClipping(base, cfg.exb_noise_multiplier, cfg.exb_clip_norm, rng)
    with RunRecord(STUDY, cfg) as run:
        wait_for_nodes(grid, 1)

        def evaluate_round(server_round: int, arrays) -> MetricRecord:  # Flower calls it after each round
            model.load_state_dict(record_to_state(arrays))
            with torch.no_grad():
                mae = float((model(x_test) - y_test).abs().mean())
            if server_round > 0:
                run.round({"round": server_round, "test_mae": mae, "sigma": dp.rounds[server_round].get("sigma")})
            return MetricRecord({"test-mae": mae})

        dp.start(grid, state_to_record(model), num_rounds=cfg.num_rounds, timeout=cfg.round_timeout,
                 train_config=config_record(asdict(cfg)), evaluate_fn=evaluate_round)
        rounds = {c: sum(c in cs for cs in base.contributors.values()) for c in range(len(parts))}
        sigma = min(info["sigma"] for info in dp.rounds.values() if "sigma" in info)
        budgets = client_budgets({c: len(parts[c][1]) for c in rounds}, cfg.exb_clip_norm, sigma, rounds,
                                 cfg.delta_total)
        return run.finish({"final_mae": run.rounds[-1]["test_mae"], "delta": cfg.delta_total,
                           "eps": max(b["eps_rdp"] for b in budgets.values())})


def train(msg: Message, context: Context) -> Message:
    """Local SGD on MSE + (mu / 2) ||w - w_global||^2 for the one client the message names."""
    conf = msg.content["config"]
    cfg = FedProxRun(**json.loads(str(conf["run-config"])))
    (cid,) = client_ids_of(conf)
    x, y = data(cfg)[0][cid]
    model = model_for(cfg)
    model.load_state_dict(record_to_state(msg.content["arrays"]))
    w0 = [p.detach().clone() for p in model.parameters()]
    opt, mu = torch.optim.SGD(model.parameters(), lr=cfg.lr), float(conf["proximal-mu"])
    gen, loss_sum = streams.torch_generator("clients.sgd", cfg.seed, int(conf["server-round"]), cid), 0.0
    for _ in range(cfg.local_epochs):
        for idx in torch.randperm(len(y), generator=gen).split(cfg.batch_size):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
            (loss + mu / 2 * sum(((p - q) ** 2).sum() for p, q in zip(model.parameters(), w0))).backward()
            opt.step()
            loss_sum += float(loss) * len(idx)
    metrics = {"num-examples": len(y), "train-loss": loss_sum / (len(y) * cfg.local_epochs), "client-ids": [cid]}
    return Message(RecordDict({"arrays": state_to_record(model), "metrics": MetricRecord(metrics)}), reply_to=msg)


SPEC = StudySpec(STUDY, ACTION, KEYS, PRESETS, lambda c: KEYS.build(FedProxRun, c), server_main, train,
                 card=summary_card(STUDY, utility_key="final_mae", scale=1.0, utility="test MAE (lower is better)"))
