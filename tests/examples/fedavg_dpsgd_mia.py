"""Example study A (issue 38): FedAvg over MNIST clients that train with DP-SGD at a target epsilon, then a
shadow-free membership attack (loss threshold, Yeom et al. 2018) on the final model.

Threat model: each client protects its own examples from the server and everyone who sees a model; its
DP-SGD noise comes from its own secret source (OS entropy, privacy.randomness), never from the run config.
The attacker holds the final model and candidate examples: the clients' training data (members) and the
held-out part of the same distribution (non-members).
"""

from __future__ import annotations

import json
from dataclasses import asdict

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from attacks.membership.runners import run_membership_attack
from datasets.image_plan import ImagePlan, ImagePlanKey, build_image_plan
from flower_apps.common.local_training import evaluate
from flower_apps.common.report_card import summary_card
from flower_apps.common.results import atomic_write_json
from flower_apps.common.run_record import RunRecord
from flower_apps.common.torch_utils import record_to_state, state_to_record
from flower_apps.config import COMMON_KEYS, SHARED_KEYS, Key, KeyTable, StudySpec
from models.small_cnn import build_small_cnn
from privacy.dpsgd.calibrate import NoiseCalibration, noise_multiplier_for_epsilon, sample_rate
from privacy.dpsgd.loop import train_dp_sgd
from strategies.cohorts import client_ids_of, config_record, wait_for_nodes
from strategies.observer import RoundObserver
from strategies.records import client_key
from strategies.registry import build_strategy

STUDY, ACTION = "example-dpsgd-mia", "example_dpsgd_mia"
KEYS = KeyTable(STUDY, (
    COMMON_KEYS["dataset"].refine(choices=("mnist-5k", "mnist", "fashion-mnist")), SHARED_KEYS["lr"],
    SHARED_KEYS["batch-size"], SHARED_KEYS["local-epochs"], SHARED_KEYS["dirichlet-alpha"], SHARED_KEYS["delta-total"],
    Key("exa-target-eps", 8.0, float, gt=0, doc="each client's DP-SGD epsilon over the whole run (example A)"),
    Key("exa-max-grad-norm", 1.0, float, gt=0, doc="DP-SGD per-example clip norm C (example A)"),
))
PRESETS = {"smoke": {"dataset": "mnist-5k", "num-clients": 4, "num-rounds": 2, "lr": 0.5, "batch-size": 64,
                     "dirichlet-alpha": 10.0}}
DpSgdRun = KEYS.config_class("DpSgdRun", run_name=("exa-target-eps",))


def plan_of(cfg: DpSgdRun) -> ImagePlan:
    """Target (clients' data) / holdout / test images; built once per process (build_image_plan caches it)."""
    return build_image_plan(ImagePlanKey(cfg.dataset, cfg.num_clients, cfg.dirichlet_alpha, cfg.seed,
                                         cfg.data_dir, cfg.data_fraction))


def calibration(cfg: DpSgdRun, n: int) -> NoiseCalibration:
    """sigma for a client of n examples: cfg.exa_target_eps over all its steps (rounds x epochs x 1/q)."""
    q = sample_rate(min(cfg.batch_size, n), n)
    return noise_multiplier_for_epsilon(cfg.exa_target_eps, cfg.delta_total, q,
                                        cfg.num_rounds * cfg.local_epochs * round(1 / q))


def model_for(cfg: DpSgdRun, plan: ImagePlan) -> torch.nn.Module:
    c, h, _ = plan.image_shape
    return build_small_cnn(cfg.seed, c, plan.num_classes, h)


def server_main(grid: Grid, cfg: DpSgdRun) -> dict:
    """FedAvg weighted by examples, central test accuracy per round, then the attack on the final model."""
    plan = plan_of(cfg)  # DataError before any folder or message
    model = model_for(cfg, plan)
    strategy = build_strategy("fedavg-examples", list(range(cfg.num_clients)), ACTION)
    with RunRecord(STUDY, cfg) as run:
        wait_for_nodes(grid, 1)

        def keep_round(server_round: int, arrays, metrics: MetricRecord | None) -> None:
            if arrays is not None:
                model.load_state_dict(record_to_state(arrays))
            acc, loss = evaluate(model, plan.x["test"], plan.y["test"])
            run.round({"round": server_round, "test_acc": acc, "test_loss": loss,
                       "eps": max(float(m["epsilon"]) for m in strategy.client_metrics[server_round].values())})

        RoundObserver(strategy, on_result=keep_round).start(
            grid, state_to_record(model), num_rounds=cfg.num_rounds, timeout=cfg.round_timeout,
            train_config=config_record(asdict(cfg)))
        n = min(len(plan.y["target_train"]), len(plan.y["target_holdout"]))
        mia = run_membership_attack("loss", model, (plan.x["target_train"][:n], plan.y["target_train"][:n]),
                                    (plan.x["target_holdout"][:n], plan.y["target_holdout"][:n]))
        atomic_write_json(run.file("attacks_mia.json"), [mia.as_row()])
        return run.finish({"final_acc": run.rounds[-1]["test_acc"], "eps": run.rounds[-1]["eps"],
                           "delta": cfg.delta_total, "mia_auc": mia.auc})


def train(msg: Message, context: Context) -> Message:
    """DP-SGD on the one client the message names, from the received model; reply its model."""
    conf = msg.content["config"]
    cfg = DpSgdRun(**json.loads(str(conf["run-config"])))
    plan = plan_of(cfg)
    (cid,) = client_ids_of(conf)
    x, y = plan.client_data(cid)
    model = model_for(cfg, plan)
    model.load_state_dict(record_to_state(msg.content["arrays"]))
    cal = calibration(cfg, len(y))
    result = train_dp_sgd(model, x, y, batch_size=min(cfg.batch_size, len(y)), noise_multiplier=cal.noise_multiplier,
                          max_grad_norm=cfg.exa_max_grad_norm, epochs=cfg.local_epochs, lr=cfg.lr,
                          delta=cfg.delta_total)  # noise=None: this client's OS entropy
    metrics = {"num-examples": len(y), "train-loss": result.stats.mean_loss, "epsilon": cal.epsilon,
               "client-ids": [cid]}
    return Message(RecordDict({client_key(cid): state_to_record(model), "metrics": MetricRecord(metrics)}),
                   reply_to=msg)


SPEC = StudySpec(STUDY, ACTION, KEYS, PRESETS, lambda c: KEYS.build(DpSgdRun, c), server_main, train,
                 card=summary_card(STUDY))
