"""Resume composes with every layer (strategies.resume, strategies.layer.Layer.state): a run stopped after round 2
and resumed from its checkpoint releases the same models, bit for bit, as the run that never stopped, with DP
wrappers in the composition (seeded noise), a drift guard and Flower's FedAdam; a secure noise source's state
never reaches the checkpoint; a layer whose state lives elsewhere refuses to be checkpointed."""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from flower_apps.tabular_pdp.strategy import CohortFedAvg
from flower_apps.ultrasound.strategy import build_ultrasound_strategy
from privacy.randomness import NoiseSource, generator_state
from strategies.drift_guard import DriftGuard
from strategies.fedavg_equal import EqualWeightFedAvg
from strategies.layer import layers
from strategies.matched_perturbation import MatchedPerturbation
from strategies.observer import RoundObserver
from strategies.personalized_clipping import PersonalizedServerSideClipping
from strategies.records import client_key, from_numpy, to_numpy
from strategies.resume import (
    checkpoint_arrays,
    encode_checkpoint,
    load_checkpoint,
    restore_strategy_state,
    strategy_state,
)
from strategies.server_fixed_clipping import ServerSideFixedClipping
from tests.conftest import FakeGrid

CLIENTS = [0, 1, 2, 3, 4]
ROUNDS = 4
START = OrderedDict(w=np.zeros((6, 5), np.float32), b=np.zeros(5, np.float32))


def _step(rnd: int, cid: int, received: OrderedDict) -> OrderedDict:
    """A client's deterministic local update: sizes vary (some above the clip norms), client 4 drifts far."""
    g = np.random.default_rng([rnd, cid])
    scale = 40.0 if cid == 4 else 0.2 * (1 + cid)
    return OrderedDict((k, (v + scale * g.standard_normal(v.shape)).astype(v.dtype)) for k, v in received.items())


def _logical(node: int, msg: Message) -> Message:  # dfl-dp's logical clients: one model per listed client
    received, rnd = to_numpy(msg.content["arrays"]), int(msg.content["config"]["server-round"])
    cids = [int(c) for c in msg.content["config"]["client-ids"]]
    out = RecordDict({client_key(c): from_numpy(_step(rnd, c, received)) for c in cids})
    out["metrics"] = MetricRecord({"num-examples": 10 * len(cids), "train-loss": 0.5, "client-ids": cids})
    return Message(out, reply_to=msg)


def _cohort(node: int, msg: Message) -> Message:  # a fixed cohort's clients: one model per reply
    received, rnd = to_numpy(msg.content["arrays"]), int(msg.content["config"]["server-round"])
    cid = int(msg.content["config"]["client-ids"][0])
    return Message(RecordDict({"arrays": from_numpy(_step(rnd, cid, received)),
                               "metrics": MetricRecord({"num-examples": 20 + cid, "train-loss": 0.5}),
                               "info": ConfigRecord({"client-id": cid})}), reply_to=msg)


def _seed_file(tmp_path) -> str:
    path = tmp_path / "noise.key"
    path.write_text("a research seed, private to the server")
    return str(path)


def _matched(seed_file):
    return MatchedPerturbation(EqualWeightFedAvg(CLIENTS, "x"), 1.0, 2.0, 1e-5, "client",
                               NoiseSource(seed_file, "cond"), (7,)), _logical


def _gdp(seed_file):
    rng = NoiseSource(seed_file, "cond").numpy_generator(1, 7)
    return ServerSideFixedClipping(CohortFedAvg(CLIENTS, "x"), 0.3, 1.0, rng, keep_noise_state=bool(seed_file)), _cohort


def _drift_pdp(seed_file):
    base = CohortFedAvg(CLIENTS, "x")
    rng = NoiseSource(seed_file, "cond").numpy_generator(2, 7)
    pdp = PersonalizedServerSideClipping(base, 0.3, 1.0, {c: 0.1 * (c + 1) for c in CLIENTS}, rng,
                                         keep_noise_state=bool(seed_file))
    return DriftGuard(pdp, base, every=1, threshold=3.0), _cohort


def _fedadam(seed_file):
    s = build_ultrasound_strategy("fedadam")
    s.set_cohort(CLIENTS, "x")
    return s, _cohort


BUILDS = {"matched-perturbation": _matched, "gdp": _gdp, "drift-guard+pdp": _drift_pdp, "fedadam": _fedadam}


def _rounds(strategy, handler, arrays: OrderedDict, first: int, last: int) -> OrderedDict:
    grid = FakeGrid([11, 12], handler)
    for rnd in range(first, last + 1):
        view = strategy.prepare_grid(grid)
        msgs = list(strategy.configure_train(rnd, from_numpy(arrays), ConfigRecord(), view))
        released, _ = strategy.aggregate_train(rnd, view.send_and_receive(msgs, timeout=5))
        assert released is not None
        arrays = to_numpy(released)
    return arrays


def _records(strategy) -> list[dict]:
    """Every layer's saved state, decoded; clip events in client order (the replies' arrival order varies)."""
    out = []
    for saved in strategy_state(strategy)["layers"]:
        got = {k: (json.loads(v) if isinstance(v, str) and k != "kind" else v) for k, v in saved.items()}
        if "clip_events" in got:
            got["clip_events"] = sorted(got["clip_events"], key=lambda e: (e["round"], e["who"]))
        for name in ("m_t", "v_t"):
            if name in got:
                got[name] = {k: t.numpy().tolist() for k, t in got[name].items()}
        out.append(got)
    return out


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_a_resumed_run_equals_the_run_that_never_stopped(tmp_path, name):
    seed_file = _seed_file(tmp_path)
    whole, handler = BUILDS[name](seed_file)
    expected = _rounds(whole, handler, START, 1, ROUNDS)

    first, _ = BUILDS[name](seed_file)
    after_two = _rounds(first, handler, START, 1, 2)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "round_checkpoint.pt").write_bytes(
        encode_checkpoint("run-1", 2, from_numpy(after_two), first, {}))
    del first  # the process that stopped

    ck = load_checkpoint(tmp_path / "run", "run-1")
    resumed, _ = BUILDS[name](seed_file)
    restore_strategy_state(resumed, ck["strategy"])
    got = _rounds(resumed, handler, to_numpy(checkpoint_arrays(ck)), 3, ROUNDS)

    for k in expected:
        np.testing.assert_array_equal(got[k], expected[k])
    # every layer's records (metrics, problems, clip events, DP rounds, drift reports, moments) are the whole run's
    assert _records(resumed) == _records(whole)
    if name == "drift-guard+pdp":
        # client 4 was flagged in round 2, before the stop: the resumed run still leaves it out
        assert resumed.reports[2].flagged == (4,) and resumed.cohort.client_ids == [0, 1, 2, 3]
        assert sorted(resumed.reports) == [1, 2, 3, 4]


def test_the_resumed_noise_is_the_uninterrupted_noise_not_a_restart(tmp_path):
    """The check above would pass if the generator restarted identically in both runs only when no state is
    needed; here a restart is visible: without the restored state, round 3's noise differs."""
    seed_file = _seed_file(tmp_path)
    first, handler = _matched(seed_file)
    after_two = _rounds(first, handler, START, 1, 2)
    state = strategy_state(first)
    whole = _rounds(first, handler, after_two, 3, 3)
    restarted, _ = _matched(seed_file)
    restored, _ = _matched(seed_file)
    restore_strategy_state(restored, state)
    assert np.array_equal(_rounds(restored, handler, after_two, 3, 3)["w"], whole["w"])
    assert not np.array_equal(_rounds(restarted, handler, after_two, 3, 3)["w"], whole["w"])


@pytest.mark.parametrize("name", ["matched-perturbation", "gdp", "drift-guard+pdp"])
def test_a_secure_noise_source_never_reaches_the_checkpoint(tmp_path, name):
    """The attacker's view: whoever reads a secure run's checkpoint learns nothing about the next rounds' noise."""
    strategy, handler = BUILDS[name](None)
    arrays = _rounds(strategy, handler, START, 1, 2)
    data = encode_checkpoint("run-1", 2, from_numpy(arrays), strategy, {})
    dp = next(x for x in layers(strategy) if hasattr(x, "rng"))
    secret = json.loads(generator_state(dp.rng))["state"]
    for part in (str(secret["state"]), str(secret["inc"])):
        assert part.encode() not in data
    (tmp_path / "round_checkpoint.pt").write_bytes(data)
    saved = load_checkpoint(tmp_path, "run-1")["strategy"]["layers"]
    assert all("noise_state" not in s for s in saved)
    # ... and a resumed secure run draws fresh noise: restoring leaves the new generator where it was
    fresh, _ = BUILDS[name](None)
    fresh_dp = next(x for x in layers(fresh) if hasattr(x, "rng"))
    before = generator_state(fresh_dp.rng)
    restore_strategy_state(fresh, {"layers": saved})
    assert generator_state(fresh_dp.rng) == before


def test_the_seeded_checkpoint_holds_the_noise_state(tmp_path):
    strategy, handler = _matched(_seed_file(tmp_path))
    _rounds(strategy, handler, START, 1, 1)
    saved = strategy_state(strategy)["layers"]
    assert saved[0]["kind"] == "MatchedPerturbation" and json.loads(saved[0]["noise_state"]) == strategy.rng.bit_generator.state


def test_a_layer_whose_state_lives_elsewhere_refuses_the_checkpoint(tmp_path):
    strategy, handler = _matched(_seed_file(tmp_path))
    observed = RoundObserver(strategy, on_replies=lambda r, replies: None)
    with pytest.raises(ValueError, match="RoundObserver cannot be resumed.*callbacks"):
        strategy_state(observed)


def test_a_checkpoint_of_another_composition_is_refused(tmp_path):
    seed_file = _seed_file(tmp_path)
    gdp, handler = _gdp(seed_file)
    _rounds(gdp, handler, START, 1, 1)
    state = strategy_state(gdp)
    pdp, _ = _drift_pdp(seed_file)
    with pytest.raises(ValueError, match=r"ServerSideFixedClipping.*not of this composition's \['DriftGuard'"):
        restore_strategy_state(pdp, state)
