"""Personalized (ARIREC) noise, the GDP wrapper vs Flower's own class, and per-client accounting."""

import math
import uuid
from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, Strategy
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from flower_apps.tabular_pdp.strategy import CohortFedAvg as ClientFedAvg
from privacy.personalized import (
    aggregate_sigma,
    gdp_sigma,
    normalized_risks,
    personalized_noise_multipliers,
    personalized_sigmas,
)
from privacy.tabular_accounting import client_budgets, gaussian_epsilon
from strategies.layer import layers
from strategies.personalized_clipping import PersonalizedServerSideClipping
from strategies.server_fixed_clipping import ServerSideFixedClipping

P = 40_000  # parameters per model: the sample SD is then within ~0.5% of sigma


def _arrays(w: np.ndarray) -> ArrayRecord:
    return ArrayRecord(OrderedDict({"w": Array(w.astype(np.float32))}))


SENT: dict[str, Message] = {}  # message id -> the train message the "server" sent


def _reply(cid: int, w: np.ndarray, n: int = 100, claim: int | None = None) -> Message:
    """Client ``cid``'s reply to its own train message (``claim``: the client id the reply says it is)."""
    out = Message(RecordDict({"config": ConfigRecord({"client-ids": [cid]})}), message_type="train.tabular_pdp",
                  dst_node_id=1)
    out.metadata.__dict__["_message_id"] = str(uuid.uuid4())  # what the grid does when it pushes
    SENT[out.metadata.message_id] = out
    return Message(RecordDict({"arrays": _arrays(w), "metrics": MetricRecord({"num-examples": n, "train-loss": 0.0}),
                               "info": ConfigRecord({"client-id": cid if claim is None else claim})}), reply_to=out)


def _planned(wrapper, replies: list[Message]) -> list[Message]:
    """Register the round's sent messages with the wrapper, as its configure_train does in a run."""
    walked = list(layers(wrapper))
    if isinstance(wrapper, DifferentialPrivacyServerSideFixedClipping):  # Flower's own wrapper is not one of ours
        walked += list(layers(wrapper.strategy))
    for layer in walked:  # every layer that checks replies remembers the round's messages
        layer._sent = [SENT[r.metadata.reply_to_message_id] for r in replies]
    return replies


class Spy(Strategy):
    """Records the replies a wrapper hands to the aggregation."""

    def __init__(self):
        self.seen = []

    def configure_train(self, *a):
        return []

    def aggregate_train(self, server_round, replies):
        self.seen = list(replies)
        return None, None

    def configure_evaluate(self, *a):
        return []

    def aggregate_evaluate(self, *a):
        return None

    def summary(self):
        pass


def _sd_consistent(sample: np.ndarray, sigma: float, alpha: float = 1e-3) -> bool:
    """Two-sided chi-square test of H0: Var = sigma^2 (zero mean known)."""
    n = sample.size
    stat = float(np.sum(sample.astype(np.float64) ** 2)) / sigma**2
    return stats.chi2.ppf(alpha / 2, n) < stat < stats.chi2.ppf(1 - alpha / 2, n)


def test_personalized_formulas_hand_case():
    # m = 2, A = (1, 3): A~ = (1/4, 3/4); n_i = 2 * 0.1 * A~ = (0.05, 0.15); sigma_i = n_i * C / sqrt(2)
    assert normalized_risks([1, 3]).tolist() == [0.25, 0.75]
    assert personalized_noise_multipliers([1, 3], 0.1) == pytest.approx([0.05, 0.15])
    assert personalized_sigmas([1, 3], 0.1, 2.0) == pytest.approx([0.05 * 2 / math.sqrt(2), 0.15 * 2 / math.sqrt(2)])
    assert gdp_sigma(0.05, 8.5, 10) == pytest.approx(0.0425)
    with pytest.raises(ValueError):
        normalized_risks([0.1, 0.0])
    with pytest.raises(ValueError):
        personalized_sigmas([0.1, 0.2], 0.05, 0.0)


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 30), st.floats(0.01, 2), st.floats(0.1, 20), st.floats(0.05, 0.5))
def test_equal_risks_reproduce_gdp_and_unequal_risks_only_add_noise(m, n_eps, clip, risk):
    equal = personalized_sigmas([risk] * m, n_eps, clip)
    assert aggregate_sigma(equal, [1] * m) == pytest.approx(gdp_sigma(n_eps, clip, m), rel=1e-9)
    skewed = personalized_sigmas([risk * (1 + i) for i in range(m)], n_eps, clip)
    assert aggregate_sigma(skewed, [1] * m) >= gdp_sigma(n_eps, clip, m) * (1 - 1e-12)  # Cauchy-Schwarz
    assert np.mean(personalized_noise_multipliers([risk * (1 + i) for i in range(m)], n_eps)) == pytest.approx(n_eps)


def test_pdp_wrapper_adds_noise_of_the_personalized_sd_to_each_client(rng):
    risks = {0: 0.116, 1: 0.121, 2: 0.35}
    spy = Spy()
    pdp = PersonalizedServerSideClipping(spy, noise_multiplier=0.05, clipping_norm=8.5, risks=risks,
                                         rng=np.random.default_rng(7))
    current = rng.normal(size=P)
    pdp.current_arrays = _arrays(current)
    pdp.aggregate_train(1, _planned(pdp, [_reply(c, current) for c in (2, 0, 1)]))  # arrival order does not matter
    expected = personalized_sigmas([risks[c] for c in (0, 1, 2)], 0.05, 8.5)
    seen = {int(r.content["info"]["client-id"]): r for r in spy.seen}
    for cid, sigma in zip((0, 1, 2), expected):
        noise = seen[cid].content["arrays"]["w"].numpy().astype(np.float64) - current.astype(np.float32)
        assert _sd_consistent(noise, sigma), (cid, noise.std(), sigma)
        assert not _sd_consistent(noise, sigma * 1.03)  # the test has the power to see a 3% error
    assert pdp.rounds[1]["sigmas"] == pytest.approx(dict(zip((0, 1, 2), expected)))


def test_pdp_aggregate_noise_matches_gdp_for_equal_risks_through_fedavg():
    m = 4
    inner = ClientFedAvg(list(range(m)), "tabular_pdp")
    pdp = PersonalizedServerSideClipping(inner, 0.05, 8.5, {c: 0.12 for c in range(m)}, np.random.default_rng(1))
    current = np.zeros(P)
    pdp.current_arrays = _arrays(current)
    agg, _ = pdp.aggregate_train(1, _planned(pdp, [_reply(c, current) for c in range(m)]))
    assert _sd_consistent(agg["w"].numpy(), gdp_sigma(0.05, 8.5, m))


def test_pdp_wrapper_clips_each_update(rng):
    spy = Spy()
    pdp = PersonalizedServerSideClipping(spy, 0.0, 1.0, {0: 0.1, 1: 0.1}, np.random.default_rng(0))
    current = rng.normal(size=50)
    pdp.current_arrays = _arrays(current)
    small = current + 0.01
    pdp.aggregate_train(1, _planned(pdp, [_reply(0, current + 10.0), _reply(1, small)]))
    d0 = spy.seen[0].content["arrays"]["w"].numpy() - current.astype(np.float32)
    d1 = spy.seen[1].content["arrays"]["w"].numpy() - current.astype(np.float32)
    assert np.linalg.norm(d0) == pytest.approx(1.0, rel=1e-5)
    assert np.linalg.norm(d1) == pytest.approx(np.linalg.norm(np.full(50, 0.01)), rel=1e-4)
    assert pdp.rounds[1]["clipped"] == 1


def _two_replies():
    """Clients 0 and 1 of 4 reply, with tiny unclipped updates (+u and -u: their mean is 0)."""
    current = np.zeros(P)
    u = np.zeros(P)
    u[0] = 1e-3
    return current, [_reply(0, current + u), _reply(1, current - u)]


def test_flower_gdp_sizes_noise_by_configured_cohort_and_uses_global_numpy():
    """What Flower 1.42's class does (documented, not used as is): sigma = n C / configured m, np.random."""
    results = []
    for _ in range(2):
        current, replies = _two_replies()
        gdp = DifferentialPrivacyServerSideFixedClipping(ClientFedAvg([0, 1, 2, 3], "x"), 0.05, 8.5, 4)
        gdp.current_arrays = _arrays(current)
        np.random.seed(3)
        agg, _ = gdp.aggregate_train(1, _planned(gdp, replies))  # 2 of 4 replied
        results.append(agg["w"].numpy())
    assert _sd_consistent(results[0], 0.05 * 8.5 / 4)
    assert not _sd_consistent(results[0], 0.05 * 8.5 / 2)
    assert np.array_equal(results[0], results[1])  # reproducible only through the global seed
    current, _ = _two_replies()
    gdp = DifferentialPrivacyServerSideFixedClipping(ClientFedAvg([0, 1], "x"), 0.05, 8.5, 2)
    gdp.current_arrays = _arrays(current)
    with pytest.raises(ZeroDivisionError):  # an unchanged model crashes Flower's clipping
        gdp.aggregate_train(1, _planned(gdp, [_reply(0, current), _reply(1, current)]))


def test_gdp_wrapper_uses_the_actual_cohort_and_its_own_generator():
    outs = []
    for _ in range(2):
        current, replies = _two_replies()
        gdp = ServerSideFixedClipping(ClientFedAvg([0, 1, 2, 3], "x"), 0.05, 8.5, np.random.default_rng(5))
        gdp.current_arrays = _arrays(current)
        state = np.random.get_state()[1].copy()
        agg, _ = gdp.aggregate_train(1, _planned(gdp, replies))
        assert np.array_equal(state, np.random.get_state()[1])  # global NumPy state untouched
        outs.append(agg["w"].numpy())
        assert gdp.rounds[1]["sigma"] == pytest.approx(0.05 * 8.5 / 2) and gdp.rounds[1]["m"] == 2
    assert _sd_consistent(outs[0], 0.05 * 8.5 / 2)
    assert not _sd_consistent(outs[0], 0.05 * 8.5 / 4)
    assert np.array_equal(outs[0], outs[1])
    current, _ = _two_replies()
    gdp = ServerSideFixedClipping(ClientFedAvg([0, 1], "x"), 0.05, 8.5, np.random.default_rng(5))
    gdp.current_arrays = _arrays(current)
    # an unchanged model (zero update; Flower's own clipping divides by its norm) is a legitimate reply
    agg, _ = gdp.aggregate_train(1, _planned(gdp, [_reply(0, current + 1.0), _reply(1, current)]))
    assert gdp.rounds[1]["update_norms"][1] == 0.0 and gdp.rounds[1]["m"] == 2
    assert np.all(np.isfinite(agg["w"].numpy()))


def test_gdp_clips_the_update_before_averaging(rng):
    current = rng.normal(size=30)
    gdp = ServerSideFixedClipping(ClientFedAvg([0, 1], "x"), 0.0, 1.0, np.random.default_rng(0))
    gdp.current_arrays = _arrays(current)
    far, near = current.copy(), current.copy()
    far[0] += 10.0
    near[1] += 0.1
    agg, _ = gdp.aggregate_train(1, _planned(gdp, [_reply(0, far), _reply(1, near)]))
    step = agg["w"].numpy() - current.astype(np.float32)
    # client 0's update (10, 0, ...) is clipped to (1, 0, ...); client 1's (0, 0.1, ...) is kept; equal weights
    assert step[0] == pytest.approx(0.5, rel=1e-4) and step[1] == pytest.approx(0.05, rel=1e-3)
    assert np.abs(step[2:]).max() < 1e-6
    assert gdp.rounds[1]["clipped"] == 1


def test_accounting_against_library_values_and_hand_sensitivities():
    b = client_budgets({0: 100, 1: 300}, clip_norm=2.0, sigma_release=0.5, rounds={0: 5, 1: 5}, delta=1e-5)
    # p = (1/4, 3/4): z_0 = 0.5 / (0.25 * 2) = 1, z_1 = 1/3
    assert b[0]["z_release"] == pytest.approx(1.0) and b[1]["z_release"] == pytest.approx(1 / 3)
    # golden values: dp-accounting RDP and Opacus' exact mu-GDP for 5 Gaussian releases with z = 1
    assert b[0]["eps_rdp"] == pytest.approx(12.30, abs=0.01)
    assert b[0]["eps_gdp_exact"] == pytest.approx(11.48, abs=0.01)
    assert b[1]["eps_rdp"] > b[0]["eps_rdp"]  # the heavier client is less protected
    sv = client_budgets({0: 1, 1: 1}, 1.0, 0.05, {0: 2, 1: 0}, 1e-5, sigma_server_view={0: 0.5, 1: 0.5})
    assert sv[0]["z_server_view"] == 0.5 and sv[1]["eps_rdp"] == 0.0
    assert gaussian_epsilon(0.0, 3, 1e-5)["eps_rdp"] == math.inf
