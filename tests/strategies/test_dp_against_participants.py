"""DP seen by an adversarial participant: it cannot reproduce the server's noise, nor shrink sigma.

Each test plays the attacker with everything its messages carried (the run config JSON, the
round, its client ids) and checks what the server released, not only the mechanism's math.
"""

import json
from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from flower_apps.tabular_pdp.strategy import CohortFedAvg as ClientFedAvg
from privacy.mechanisms import calibrate_sigma_abs
from privacy.randomness import STREAM_MATCHED_PERTURBATION, STREAM_TABULAR_SERVER, NoiseSource
from strategies.cohorts import REJECTED_REPLY, check_replies
from strategies.personalized_clipping import PersonalizedServerSideClipping
from strategies.records import client_key, from_numpy, to_numpy
from strategies.registry import build_strategy
from strategies.server_fixed_clipping import ServerSideFixedClipping

SHAPE = (60, 50)  # 3,000 noise values: a reproduced draw would match to float precision
RUN_CONFIG = {"seed": 7, "num-clients": 4, "num-rounds": 3, "eps-cal": 2.0, "clip-norm": 1.0, "delta-cal": 1e-5}


def zero_model() -> OrderedDict:
    return OrderedDict(w=np.zeros(SHAPE, np.float32))


def fl_handler(forge_on_node: int | None = None, extra=(100, 101, 102, 103)):
    """FL clients return the model unchanged (so the release is pure noise); one node may forge clients."""

    def handler(node: int, msg: Message) -> Message:
        received = to_numpy(msg.content["arrays"])
        cids = [int(c) for c in msg.content["config"]["client-ids"]]
        listed = cids + (list(extra) if node == forge_on_node else [])
        out = RecordDict({client_key(c): from_numpy(received) for c in listed})
        out["metrics"] = MetricRecord({"num-examples": 10 * len(listed), "train-loss": 0.0, "client-ids": listed})
        return Message(out, reply_to=msg)

    return handler


def chain_handler(forge_on_node: int | None = None, extra=(100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111)):
    """Chain hops add 1 to the token; one hop may list extra clients it never trained."""

    def handler(node: int, msg: Message) -> Message:
        received = to_numpy(msg.content["arrays"])
        cids = [int(c) for c in msg.content["config"]["client-ids"]]
        listed = cids + (list(extra) if node == forge_on_node else [])
        out = RecordDict({client_key(cids[-1]): from_numpy(OrderedDict((k, v + 1) for k, v in received.items()))})
        out["metrics"] = MetricRecord({"num-examples": 10, "train-loss": 0.0, "client-ids": listed})
        return Message(out, reply_to=msg)

    return handler


def one_round(strategy, grid, arrays: OrderedDict, rnd: int = 1):
    g = strategy.prepare_grid(grid)
    cfg = ConfigRecord({"run-config": json.dumps(RUN_CONFIG, sort_keys=True)})
    msgs = list(strategy.configure_train(rnd, from_numpy(arrays), cfg, g))
    replies = g.send_and_receive(msgs, timeout=5)
    return strategy.aggregate_train(rnd, replies), msgs


def attacker_guesses(msg: Message, shape) -> list[np.ndarray]:
    """Every standard-normal draw a participant can derive from integers its message carried."""
    cfg = msg.content["config"]
    ints = {int(v) for v in json.loads(str(cfg["run-config"])).values() if isinstance(v, (int, float))}
    ints |= {int(cfg["server-round"])} | {int(c) for c in cfg["client-ids"]}
    gens = []
    for v in sorted(i for i in ints if i >= 0):
        gens += [np.random.default_rng(v), np.random.default_rng([v, STREAM_MATCHED_PERTURBATION]),
                 np.random.default_rng([v, 0xD9]),  # the derivation this platform used before the fix
                 np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence([v, STREAM_MATCHED_PERTURBATION])))]
    return [g.standard_normal(size=shape) for g in gens]


@pytest.mark.parametrize("framework", ["fl", "sequential-dfl"])
def test_a_participant_cannot_reproduce_the_server_noise(fake_grid_cls, framework):
    handler = fl_handler() if framework == "fl" else chain_handler()
    grid = fake_grid_cls([1, 2, 3, 4], handler)
    s = build_strategy(framework, [0, 1, 2, 3], "x", dp=True, clip_norm=1.0, eps_cal=2.0, stream=(7,))
    (arrays, metrics), msgs = one_round(s, grid, zero_model())
    released = to_numpy(arrays)["w"].astype(np.float64)
    if framework == "sequential-dfl":
        # the token was +4 per coordinate, clipped to norm C = 1 -> 1/sqrt(P) per coordinate
        released -= 1.0 / np.sqrt(np.prod(SHAPE))
    z = released / metrics["sigma-abs"]
    assert 0.9 < z.std() < 1.1  # what was released really is noise of the reported scale
    for guess in attacker_guesses(msgs[0], SHAPE):
        assert np.abs(guess - z).max() > 1e-3, "a participant reproduced the server's noise"
    # and the same configuration run again draws other noise: nothing in the messages fixes it
    grid = fake_grid_cls([1, 2, 3, 4], handler)
    s2 = build_strategy(framework, [0, 1, 2, 3], "x", dp=True, clip_norm=1.0, eps_cal=2.0, stream=(7,))
    (arrays2, _), _ = one_round(s2, grid, zero_model())
    assert not np.array_equal(to_numpy(arrays2)["w"], to_numpy(arrays)["w"])


def test_opt_in_seeded_noise_is_reproducible_and_recorded(fake_grid_cls, tmp_path):
    secret = tmp_path / "server.seed"
    secret.write_text("9f86d081884c7d65")
    outs = []
    for _ in range(2):
        s = build_strategy("fl", [0, 1], "x", dp=True, clip_norm=1.0, eps_cal=2.0, noise=NoiseSource(str(secret)),
                           stream=(7,))
        (arrays, _), _ = one_round(s, fake_grid_cls([1, 2], fl_handler()), zero_model())
        outs.append(to_numpy(arrays)["w"])
    np.testing.assert_array_equal(outs[0], outs[1])
    assert s.noise.describe() == {"noise_mode": "seeded", "noise_seed_file": str(secret)}
    assert NoiseSource().describe()["noise_mode"] == "secure"
    with pytest.raises(FileNotFoundError, match="noise-seed-file"):
        NoiseSource(str(tmp_path / "missing")).check()


def test_fl_reply_forging_extra_clients_is_rejected_and_sigma_is_not_shrunk(fake_grid_cls):
    grid = fake_grid_cls([1, 2, 3, 4], fl_handler(forge_on_node=2))
    s = build_strategy("fl", [0, 1, 2, 3], "x", dp=True, clip_norm=1.0, eps_cal=2.0)
    (arrays, metrics), _ = one_round(s, grid, zero_model())
    assert metrics["num-rejected"] == 1
    assert metrics["num-contributors"] == 3 and metrics["num-failed"] == 1
    assert metrics["sigma-abs"] == pytest.approx(calibrate_sigma_abs(1.0, 3, 2.0))
    assert metrics["sigma-abs"] > calibrate_sigma_abs(1.0, 4, 2.0) > calibrate_sigma_abs(1.0, 8, 2.0)


def test_fl_packed_message_missing_or_adding_a_client_is_rejected(fake_grid_cls):
    # two clients per message; node 1 (clients 0, 1) also lists client 2, which another message plays
    grid = fake_grid_cls([1, 2], fl_handler(forge_on_node=1, extra=(2,)))
    s = build_strategy("fl", [0, 1, 2, 3], "x", clients_per_message=2, dp=True, clip_norm=1.0, eps_cal=2.0)
    (_, metrics), _ = one_round(s, grid, zero_model())
    assert metrics["num-rejected"] == 1 and metrics["num-contributors"] == 2


def test_dfl_hop_listing_extra_clients_is_rejected_and_the_token_passes_on(fake_grid_cls):
    grid = fake_grid_cls([1, 2, 3, 4], chain_handler(forge_on_node=3))
    s = build_strategy("sequential-dfl", [0, 1, 2, 3], "x", dp=True, clip_norm=1e3, eps_cal=1e6)
    (arrays, metrics), _ = one_round(s, grid, zero_model())
    assert metrics["num-rejected"] == 0  # the relay already refused the hop: it arrives as a failure
    assert metrics["num-contributors"] == 3 and metrics["num-failed"] == 1
    assert metrics["sigma-abs"] == pytest.approx(calibrate_sigma_abs(1e3, 3, 1e6))
    # three honest hops added 1 each; the forger's token was discarded (huge C and eps: tiny noise)
    np.testing.assert_allclose(to_numpy(arrays)["w"], 3.0, atol=0.05)


def test_check_replies_refuses_unknown_and_duplicate_answers(fake_grid_cls):
    grid = fake_grid_cls([1, 2], fl_handler())
    s = build_strategy("fl", [0, 1], "x")
    g = s.prepare_grid(grid)
    msgs = list(s.configure_train(1, from_numpy(zero_model()), ConfigRecord(), g))
    replies = g.send_and_receive(msgs, timeout=5)
    stray = Message(RecordDict(), reply_to=Message(RecordDict({"config": ConfigRecord({"client-ids": [0]})}),
                                                   dst_node_id=1, message_type="train.x"))
    checked = check_replies(msgs, replies + [replies[0], stray])
    assert checked.contributors == [0, 1] and len(checked.valid) == 2
    assert len(checked.rejected) == 2
    assert any("second reply" in r for r in checked.rejected) and any("did not send" in r for r in checked.rejected)


# --- tabular GDP and PDP -------------------------------------------------------------------------

def tab_handler(liar_node: int | None = None, claim: int = 0):
    """Tabular clients return w + 0.01; the liar claims to be client ``claim`` (already in the cohort)."""

    def handler(node: int, msg: Message) -> Message:
        cid = int(msg.content["config"]["client-ids"][0])
        w = to_numpy(msg.content["arrays"])
        return Message(RecordDict({
            "arrays": from_numpy(OrderedDict((k, v + 0.01) for k, v in w.items())),
            "metrics": MetricRecord({"num-examples": 100, "train-loss": 0.0}),
            "info": ConfigRecord({"client-id": claim if node == liar_node else cid})}), reply_to=msg)

    return handler


@pytest.mark.parametrize("setting", ["gdp", "pdp"])
def test_tabular_reply_speaking_for_another_client_is_rejected(fake_grid_cls, setting):
    clients = [0, 1, 2, 3]
    base = ClientFedAvg(clients, "tabular_pdp")
    rng = NoiseSource().numpy_generator(STREAM_TABULAR_SERVER, 7, 1)
    if setting == "gdp":
        wrapper = ServerSideFixedClipping(base, 0.05, 8.5, rng)
    else:
        wrapper = PersonalizedServerSideClipping(base, 0.05, 8.5, {c: 0.12 for c in clients}, rng)
    grid = fake_grid_cls([11, 12, 13, 14], tab_handler(liar_node=13, claim=0))
    msgs = list(wrapper.configure_train(1, from_numpy(zero_model()), ConfigRecord(), grid))
    replies = grid.send_and_receive(msgs)
    arrays, _ = wrapper.aggregate_train(1, replies)
    assert arrays is not None
    info = wrapper.rounds[1]
    assert info["m"] == 3 and info["rejected"] == 1  # sigma sized for the 3 honest clients, never 4 or 5
    assert base.contributors[1] == [0, 1, 3]
    if setting == "gdp":
        assert info["sigma"] == pytest.approx(0.05 * 8.5 / 3)


def test_rejected_reply_is_an_error_reply_naming_the_problem(fake_grid_cls):
    grid = fake_grid_cls([11, 12], tab_handler(liar_node=12, claim=0))
    base = ClientFedAvg([0, 1], "tabular_pdp")
    msgs = list(base.configure_train(1, from_numpy(zero_model()), ConfigRecord(), grid))
    checked = check_replies(msgs, grid.send_and_receive(msgs), array_claims="none")
    assert checked.contributors == [0]
    (err,) = checked.failed
    assert err.has_error() and err.error.code == REJECTED_REPLY
    assert "speaks for client 0, asked for [1]" in err.error.reason


def test_noise_source_streams_are_independent_and_secret_by_default():
    a = NoiseSource().numpy_generator(1, 2).standard_normal(100)
    b = NoiseSource().numpy_generator(1, 2).standard_normal(100)
    assert not np.array_equal(a, b)
    with pytest.raises(ValueError, match="stream labels"):
        NoiseSource().seed_sequence(-1)
