"""dfl-dp's ClientApp seeds the dropout masks for the local-training call only.

The handler used to call ``torch.manual_seed(client seed)`` before ``train_local`` and leave torch's
global generator there. It now runs the call inside ``models.seeded_init.seeded_init``: the trained
models must be bit-identical to the old form (written out by hand below, dropout active), and the
caller's global generator must be exactly as it was.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from datasets.node_local import write_image_node
from flower_apps.common.local_training import train_local
from flower_apps.common.torch_utils import record_to_state, state_to_record
from flower_apps.dfl_dp import client_app
from flower_apps.dfl_dp.config import ACTION
from flower_apps.dfl_dp.data import node_clients
from flower_apps.dfl_dp.server_app import config_record_for
from models.small_cnn import build_small_cnn
from strategies.cohorts import build_messages
from strategies.records import client_key

CLIENTS, ROUND = [0, 1], 2


@pytest.fixture
def run(tmp_path):
    from flower_apps.router import prepare

    rng = np.random.default_rng(0)
    write_image_node(tmp_path, {c: (rng.integers(0, 255, (12, 8, 8), dtype=np.uint8), np.arange(12) % 10)
                                for c in CLIENTS}, num_classes=10, mean=(0.1307,), std=(0.3081,), node="site-a")
    cfg = prepare({"study": "dfl-dp", "preset": "smoke", "num-clients": 2, "node-local-data": True,
                   "eval-data-path": "unused-here", "batch-size": 4, "local-epochs": 2})[1]
    return cfg, tmp_path


def _old_form(cfg, path, initial):
    """What the handler did before: the global generator seeded with the client's seed, left there."""
    plan, models = node_clients(str(path), "site-a"), {}
    with torch.random.fork_rng(devices=[]):
        for cid in CLIENTS:
            model = build_small_cnn(cfg.seed, 1, 10, 8)
            model.load_state_dict(initial)
            x, y = plan.client_data(cid)
            s = (cfg.seed * 1_000_003 + ROUND) * 10_007 + cid
            torch.manual_seed(s)
            train_local(model, x, y, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                        batch_size=cfg.batch_size, epochs=cfg.local_epochs, grad_clip=cfg.grad_clip,
                        generator=torch.Generator().manual_seed(s), device=torch.device("cpu"))
            models[cid] = model.state_dict()
    return models


def test_client_training_is_the_old_one_and_leaves_the_global_generator_alone(run, monkeypatch):
    cfg, path = run
    assert cfg.framework == "fl" and cfg.device in ("auto", "cpu")
    initial_model = build_small_cnn(cfg.seed, 1, 10, 8)
    assert any(isinstance(m, torch.nn.Dropout) for m in initial_model.modules())  # the masks matter
    initial = initial_model.state_dict()
    conf = config_record_for(cfg)
    conf["server-round"] = ROUND
    (msg,) = build_messages([(1, CLIENTS)], state_to_record(initial_model), conf, ACTION)
    old = _old_form(cfg, path, initial)

    torch.manual_seed(12345)
    before = torch.get_rng_state()
    monkeypatch.setattr(torch, "manual_seed", lambda *_: pytest.fail("torch.manual_seed called"))
    monkeypatch.setattr("flower_apps.dfl_dp.client_app.pick_device", lambda _: torch.device("cpu"))
    reply = client_app.train(msg, Context(1, 1, {"data-path": str(path), "node-name": "site-a"}, RecordDict(), {}))
    assert torch.equal(torch.get_rng_state(), before)  # the caller's generator is untouched

    assert not reply.has_error()
    for cid in CLIENTS:
        new = record_to_state(reply.content[client_key(cid)])
        assert all(torch.equal(new[k], old[cid][k]) for k in old[cid]), f"client {cid} trained differently"
    assert not all(torch.equal(old[0][k], old[1][k]) for k in old[0])


def test_the_old_form_depends_on_the_dropout_seed(run):
    """The comparison above can fail: another seed for the masks gives other weights."""
    cfg, path = run
    plan = node_clients(str(path), "site-a")
    x, y = plan.client_data(0)
    states = []
    for mask_seed in (1, 2):
        model = build_small_cnn(cfg.seed, 1, 10, 8)
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(mask_seed)
            train_local(model, x, y, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                        batch_size=cfg.batch_size, epochs=cfg.local_epochs, grad_clip=cfg.grad_clip,
                        generator=torch.Generator().manual_seed(7), device=torch.device("cpu"))
        states.append(model.state_dict())
    assert not all(torch.equal(states[0][k], states[1][k]) for k in states[0])
