"""The party that adds DP noise alone holds its secret, and seeded noise mixes the whole condition.

Two findings of the security review, each tested in the real code path:

- the coordinator's run config named a seed file that the ultrasound clients used for their DP-SGD
  noise, so the coordinator could replay a client's noise and Poisson batches and recover its clipped
  gradient sum. Now a client's seed file comes only from its own node (``--node-config
  noise-seed-file``, else ``$PPFL_NOISE_SEED_FILE``); the run key is refused, and a client asked for
  seeded noise without a file of its own replies with an error.
- seeded noise mixed only the mechanism and the seed, so released models of two grid points of one
  seed (two eps-cal values) carried proportional noise and cancelled it. Now the run's config hash
  is mixed in (``flower_apps.config.noise_condition``): only the same run draws the same noise.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from flower_apps.common.torch_utils import state_to_record
from flower_apps.config import RUN_CONFIG_DEFAULTS, ConfigError, noise_condition
from flower_apps.router import prepare
from flower_apps.ultrasound import client_app
from flower_apps.ultrasound.data import build_data, data_key
from flower_apps.ultrasound.models import model_skeleton
from flower_apps.ultrasound.study import NOISE_SEED_ENV
from privacy.randomness import NoiseSource
from strategies.records import client_key

torch.set_num_threads(1)
# The smallest DP-SGD client round of the ultrasound study (as tests/ultrasound/test_ultrasound_resume.py).
US_TINY = {"study": "ultrasound", "preset": "smoke", "dataset": "synthetic", "num-clients": 2, "num-rounds": 1,
           "local-epochs": 1, "data-fraction": 0.25, "us-image-size": 32, "us-pretrained": False,
           "us-dp-sgd": True, "us-noise-multiplier": 1.0, "us-max-grad-norm": 1.0}


def _secret(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _us_cfg(tmp_path, **over):
    return prepare({**RUN_CONFIG_DEFAULTS, **US_TINY, "results-dir": str(tmp_path), **over})[1]


def _us_client_round(cfg, node_config: dict) -> Message:
    """Client 0's reply to one train message of ``cfg`` (the real ClientApp handler, a fixed initial model)."""
    data = build_data(data_key(cfg))
    torch.manual_seed(0)
    model = model_skeleton(cfg.arch, data.num_classes, cfg.image_size, cfg.dp_sgd, cfg.dp_finetune)
    conf = ConfigRecord({"run-config": cfg.to_json(), "server-round": 1, "client-ids": [0]})
    msg = Message(RecordDict({"arrays": state_to_record(model), "config": conf}), dst_node_id=7,
                  message_type="train.ultrasound")
    return client_app.train(msg, Context(1, 7, node_config, RecordDict(), {}))


def _weights(reply: Message) -> np.ndarray:
    assert not reply.has_error(), reply.error.reason
    arrays = reply.content["arrays"]
    return np.concatenate([np.asarray(a.numpy(), np.float64).ravel() for a in arrays.values()])


def test_the_run_config_cannot_name_an_ultrasound_clients_seed_file(tmp_path):
    readable = _secret(tmp_path / "coordinator.seed", "the coordinator's file")
    with pytest.raises(ConfigError, match="noise-seed-file: .*never names a client's seed file.*us-noise-mode"):
        _us_cfg(tmp_path, **{"noise-seed-file": readable})
    with pytest.raises(ConfigError, match="us-noise-mode"):
        _us_cfg(tmp_path, **{"us-noise-mode": "replayable"})


def test_a_seed_file_named_by_the_coordinator_never_seeds_a_clients_dp_sgd_noise(tmp_path, monkeypatch):
    """A hostile coordinator skips the key check and puts its own readable file in the message's config."""
    monkeypatch.delenv(NOISE_SEED_ENV, raising=False)
    coordinator_file = _secret(tmp_path / "coordinator.seed", "the coordinator's file")
    hostile = dataclasses.replace(_us_cfg(tmp_path), noise_seed_file=coordinator_file)
    # Secure mode (the default): the same message twice gives other noise (the coordinator's file is never read).
    a, b = _weights(_us_client_round(hostile, {})), _weights(_us_client_round(hostile, {}))
    assert not np.allclose(a, b)
    assert hostile.noise_mode == "secure"
    # Seeded mode on a node that has no seed file of its own: an error reply naming the problem, no training.
    seeded = dataclasses.replace(hostile, noise_mode="seeded")
    reply = _us_client_round(seeded, {})
    assert reply.has_error() and "no seed file of its own" in reply.error.reason
    assert NOISE_SEED_ENV in reply.error.reason and "noise-seed-file" in reply.error.reason
    missing = _us_client_round(seeded, {"noise-seed-file": str(tmp_path / "absent.seed")})
    assert missing.has_error() and "does not exist" in missing.error.reason


def test_a_nodes_own_seed_file_makes_its_dp_sgd_noise_reproducible_and_only_its_own(tmp_path, monkeypatch):
    monkeypatch.delenv(NOISE_SEED_ENV, raising=False)
    node_file = _secret(tmp_path / "node.seed", "this node's own secret")
    coordinator_file = _secret(tmp_path / "coordinator.seed", "the coordinator's file")
    cfg = dataclasses.replace(_us_cfg(tmp_path, **{"us-noise-mode": "seeded"}), noise_seed_file=coordinator_file)
    node = {"noise-seed-file": node_file}
    first = _weights(_us_client_round(cfg, node))
    np.testing.assert_array_equal(first, _weights(_us_client_round(cfg, node)))  # bit-reproducible on the node
    # The coordinator, seeding the client's code path with the file it named, gets other noise.
    assert not np.allclose(first, _weights(_us_client_round(cfg, {"noise-seed-file": coordinator_file})))
    # In a simulation the node's environment says it; --node-config wins over the environment.
    monkeypatch.setenv(NOISE_SEED_ENV, node_file)
    np.testing.assert_array_equal(first, _weights(_us_client_round(cfg, {})))
    monkeypatch.setenv(NOISE_SEED_ENV, coordinator_file)
    np.testing.assert_array_equal(first, _weights(_us_client_round(cfg, node)))


def test_a_seeded_client_draws_other_noise_for_another_received_model(tmp_path):
    """A coordinator that re-sends a round with another model cannot make two replies share noise."""
    node_file = _secret(tmp_path / "node.seed", "this node's own secret")
    cfg = _us_cfg(tmp_path, **{"us-noise-mode": "seeded"})
    context = Context(1, 7, {"noise-seed-file": node_file}, RecordDict(), {})
    data = build_data(data_key(cfg))
    models = [model_skeleton(cfg.arch, data.num_classes, cfg.image_size, True, cfg.dp_finetune) for _ in range(2)]
    with torch.no_grad():
        next(models[1].parameters()).add_(1e-3)
    seeds = [client_app.dp_settings(cfg, context, state_to_record(m)).noise.torch_seed(1, 2) for m in models]
    assert seeds[0] != seeds[1]
    again = client_app.dp_settings(cfg, context, state_to_record(models[0])).noise.torch_seed(1, 2)
    assert again == seeds[0]


def test_the_noise_condition_ignores_locations_but_not_grid_points():
    a = prepare({"preset": "smoke", "eps-cal": 2.0})[1]
    assert noise_condition(a) == noise_condition(prepare({"preset": "smoke", "eps-cal": 2.0, "results-dir": "x",
                                                          "run-name": "y", "device": "cpu"})[1])
    # a deployed run draws its simulation's noise (tests/deploy/test_node_local_federation.py compares them)
    deployed = dataclasses.replace(a, node_local_data=True, eval_data_path="/coordinator/eval.npz")
    assert noise_condition(deployed) == noise_condition(a)
    for other in ({"eps-cal": 4.0}, {"seed": 1}, {"clip-norm": 2.0}, {"num-rounds": 3}):
        assert noise_condition(prepare({"preset": "smoke", "eps-cal": 2.0, **other})[1]) != noise_condition(a), other


def _echo(node: int, msg: Message) -> Message:
    """A client whose update is zero: the released model minus the sent one is the server's noise alone."""
    ids = [int(c) for c in msg.content["config"]["client-ids"]]
    out = RecordDict({client_key(c): msg.content["arrays"] for c in ids})
    out["metrics"] = MetricRecord({"num-examples": len(ids), "train-loss": 0.0, "client-ids": ids,
                                   "train-seconds": 0.0, "cuda": 0})  # the keys dfl-dp's ClientApp sends
    return Message(out, reply_to=msg)


def _dfl_dp_noise(tmp_path, fake_grid_cls, name: str, seed_file: str, eps_cal: float) -> np.ndarray:
    from flower_apps.dfl_dp.server_app import run_dir, server_main

    cfg = prepare({"preset": "smoke", "num-rounds": 1, "num-clients": 4, "clients-per-message": 2,
                   "eps-cal": eps_cal, "noise-seed-file": seed_file, "results-dir": str(tmp_path),
                   "run-name": name})[1]
    grid = fake_grid_cls([1, 2], _echo)
    server_main(grid, cfg)
    sent = {k: v.numpy() for k, v in grid.log[0][1].content["arrays"].items()}
    released = torch.load(run_dir(cfg) / "final_model.pt", weights_only=True)
    return np.concatenate([(released[k].cpu().numpy() - sent[k]).ravel() for k in sent]).astype(np.float64)


def test_two_grid_points_of_one_seed_never_share_the_servers_noise(tmp_path, fake_grid_cls):
    """dfl-dp (matched perturbation): eps-cal 2 and 4, same seed and seed file; the old noise was proportional."""
    secret = _secret(tmp_path / "server.seed", "the server's own secret")
    n2 = _dfl_dp_noise(tmp_path, fake_grid_cls, "eps2", secret, 2.0)
    n4 = _dfl_dp_noise(tmp_path, fake_grid_cls, "eps4", secret, 4.0)
    assert np.linalg.norm(n2) > 0 and np.linalg.norm(n4) > 0
    cosine = float(n2 @ n4 / (np.linalg.norm(n2) * np.linalg.norm(n4)))
    # independent noise: |cos| ~ N(0, 1/d), d > 10^4 parameters; proportional noise gives cos = 1
    assert abs(cosine) < 0.05, cosine
    # the same config (another run folder) draws the same noise, bit for bit
    np.testing.assert_array_equal(n2, _dfl_dp_noise(tmp_path, fake_grid_cls, "eps2-again", secret, 2.0))


def test_tabular_server_noise_differs_between_grid_points(tmp_path):
    """tabular-pdp's GDP/PDP server noise generator, as its ServerApp builds it, for two noise multipliers."""
    from flower_apps.tabular_pdp.server_app import _strategy

    secret = _secret(tmp_path / "server.seed", "the server's own secret")

    def draws(z: float) -> np.ndarray:
        cfg = prepare({"study": "tabular-pdp", "preset": "smoke", "tab-noise-multiplier": z,
                       "noise-seed-file": secret})[1]
        dp = _strategy("gdp", cfg, [0, 1], 1.0, {})[1]
        return dp.rng.standard_normal(16)

    np.testing.assert_array_equal(draws(0.05), draws(0.05))
    assert not np.allclose(draws(0.05), draws(0.1))


def test_seeded_streams_mix_the_condition_and_secure_ignores_it(tmp_path):
    secret = _secret(tmp_path / "s.seed", "secret")
    draw = lambda src: src.numpy_generator(1, 2).standard_normal(8)
    np.testing.assert_array_equal(draw(NoiseSource(secret, "run-a")), draw(NoiseSource(secret, "run-a")))
    assert not np.allclose(draw(NoiseSource(secret, "run-a")), draw(NoiseSource(secret, "run-b")))
    assert not np.allclose(draw(NoiseSource(None, "run-a")), draw(NoiseSource(None, "run-a")))
