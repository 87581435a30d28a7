"""Client sampling at the strategy level: who gets messages, what is released, how the noise is sized."""

from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import Message, MetricRecord, RecordDict
from scipy import stats

from privacy.audit.canaries import make_canaries
from privacy.mechanisms import calibrate_sigma_abs, clip_by_l2
from privacy.randomness import NoiseSource
from privacy.sampling import CohortSampler
from strategies.cohorts import planned_clients
from strategies.records import client_key, from_numpy, to_numpy
from strategies.registry import build_strategy

SHAPES = {"w": (2, 3), "b": (3,)}


def model_of(value: float, shapes=SHAPES) -> OrderedDict:
    return OrderedDict((k, np.full(s, value, dtype=np.float32)) for k, s in shapes.items())


def step_handler(chain: bool = False, forge: dict[int, list[int]] | None = None, seen: list | None = None):
    """FL clients return received + (cid + 1); chain hops add 1. ``forge``: node -> extra clients its reply
    also claims to have trained (models and client-ids); ``seen`` records every client asked."""

    def handler(node: int, msg: Message) -> Message:
        received = to_numpy(msg.content["arrays"])
        cids = [int(c) for c in msg.content["config"]["client-ids"]]
        if seen is not None:
            seen.extend(cids)
        listed = cids + (forge or {}).get(node, [])
        out = RecordDict()
        if chain:
            token = OrderedDict((k, v + len(cids)) for k, v in received.items())
            out[client_key(cids[-1])] = from_numpy(token)
        else:
            for c in listed:
                out[client_key(c)] = from_numpy(OrderedDict((k, v + (c + 1)) for k, v in received.items()))
        out["metrics"] = MetricRecord({"num-examples": 10 * len(cids), "train-loss": 1.0, "client-ids": listed})
        return Message(out, reply_to=msg)

    return handler


def one_round(strategy, grid, arrays: OrderedDict, rnd: int = 1):
    return grid.run_round(strategy, arrays, rnd)


def sampler(scheme: str, q: float, n: int, seed: int = 0, extra: int = 0) -> CohortSampler:
    return CohortSampler(scheme, q, n, np.random.default_rng(seed), num_extra=extra)


def test_only_the_sampled_clients_get_messages_and_the_draw_is_deterministic_for_a_seed(fake_grid_cls):
    for scheme in ("poisson", "fixed"):
        runs = []
        for _ in range(2):
            seen: list[int] = []
            grid = fake_grid_cls([1, 2, 3], step_handler(seen=seen))
            s = build_strategy("fl", list(range(20, 40)), "x", clients_per_message=3, sampler=sampler(scheme, 0.3, 20, 7))
            cohorts = []
            for rnd in (1, 2, 3):
                _, metrics, msgs = one_round(s, grid, model_of(0.0), rnd)
                planned = sorted(c for m in msgs for c in planned_clients(m))
                drawn = [20 + int(i) for i in s.sampler.clients(rnd)]
                assert planned == drawn and metrics["num-sampled"] == len(drawn)
                assert metrics["num-contributors"] == len(drawn) and metrics["num-failed"] == 0
                cohorts.append(drawn)
            assert sorted(set(seen)) == sorted({c for d in cohorts for c in d})  # nobody else was asked
            runs.append(cohorts)
        assert runs[0] == runs[1]
        if scheme == "fixed":
            assert all(len(c) == 6 for c in runs[0])


def test_a_reply_for_an_unsampled_client_is_refused_and_cannot_move_the_noise(fake_grid_cls):
    """A sampled node's reply that also speaks for clients the draw left out is rejected as a whole."""
    n = 8
    probe = sampler("fixed", 0.5, n, 3)
    drawn = [int(i) for i in probe.clients(1)]
    outsiders = [c for c in range(n) if c not in drawn]
    # clients_per_message=1 on as many nodes as drawn clients: node k answers for drawn[k]
    nodes = list(range(1, len(drawn) + 1))
    grid = fake_grid_cls(nodes, step_handler(forge={nodes[0]: outsiders[:2]}))
    s = build_strategy("fl", list(range(n)), "x", dp=True, clip_norm=1.0, eps_cal=2.0, sampler=sampler("fixed", 0.5, n, 3))
    arrays, metrics, _ = one_round(s, grid, model_of(0.0))
    assert metrics["num-rejected"] == 1 and metrics["num-contributors"] == len(drawn) - 1
    assert metrics["num-failed"] == 1  # the forger counts as a failed sampled client, not as three members
    assert metrics["sigma-abs"] == pytest.approx(calibrate_sigma_abs(1.0, len(drawn) - 1, 2.0))
    problems = s.strategy.problems[1]
    assert set(problems) == {drawn[0]} and "asked for" in problems[drawn[0]]


def test_poisson_divides_the_clipped_sum_by_the_fixed_expected_cohort(fake_grid_cls):
    """DP-FedAvg: w + sum_i clip(u_i) / (q N) + z, with sigma_abs sized for q N, whatever the draw's size."""
    n, q, clip = 10, 0.4, 0.5
    grid = fake_grid_cls([1, 2], step_handler())
    s = build_strategy("fl", list(range(n)), "x", dp=True, clip_norm=clip, eps_cal=1e6, sampler=sampler("poisson", q, n, 1))
    for rnd in (1, 2, 3):
        arrays, metrics, _ = one_round(s, grid, model_of(0.0), rnd)
        drawn = [int(i) for i in s.strategy.sampler.clients(rnd)]
        # every update (cid + 1) * ones(9) has norm > 0.5: each clips to 0.5 * ones / 3
        expected = sum(clip_by_l2([np.full(9, c + 1.0)], clip)[0][0] for c in drawn) / (q * n)
        np.testing.assert_allclose(to_numpy(arrays)["w"].ravel(), expected[:6], atol=1e-5)
        assert metrics["sigma-abs"] == pytest.approx(calibrate_sigma_abs(clip, q * n, 1e6))
        assert metrics["num-sampled"] == len(drawn)


@pytest.mark.parametrize("framework", ["fl", "sequential-dfl"])
def test_an_empty_poisson_cohort_releases_noise_only(fake_grid_cls, framework):
    """Nobody drawn: no message is sent, and the release is w(t) + z with sigma_abs sized for q N (an unchanged
    model would tell everyone the cohort was empty)."""
    shapes = {"w": (200, 200)}
    start = model_of(0.25, shapes)
    grid = fake_grid_cls([1, 2], step_handler(chain=framework != "fl"))
    s = build_strategy(framework, list(range(5)), "x", dp=True, clip_norm=1.0, eps_cal=2.0,
                       sampler=sampler("poisson", 1e-9, 5))
    arrays, metrics, msgs = one_round(s, grid, start)
    assert msgs == [] and grid.log == []
    assert metrics["num-contributors"] == 0 and metrics["num-sampled"] == 0 and metrics["num-failed"] == 0
    sigma = calibrate_sigma_abs(1.0, 5e-9, 2.0)
    assert metrics["sigma-abs"] == pytest.approx(sigma)
    z = (to_numpy(arrays)["w"].astype(np.float64) - 0.25).ravel()
    stat = np.sum(z ** 2) / sigma ** 2
    assert 2 * min(stats.chi2.cdf(stat, z.size), stats.chi2.sf(stat, z.size)) > 1e-3


def test_a_poisson_round_whose_clients_all_fail_still_releases(fake_grid_cls):
    grid = fake_grid_cls([1, 2], step_handler(), fail_nodes={1, 2})
    s = build_strategy("fl", list(range(6)), "x", dp=True, clip_norm=1.0, eps_cal=2.0, sampler=sampler("poisson", 0.5, 6))
    arrays, metrics, _ = one_round(s, grid, model_of(0.0))
    assert arrays is not None and metrics["num-contributors"] == 0
    assert metrics["sigma-abs"] == pytest.approx(calibrate_sigma_abs(1.0, 3.0, 2.0))
    # without sampling (or fixed-size) a round nobody answered releases nothing, as before
    fixed = build_strategy("fl", list(range(6)), "x", dp=True, clip_norm=1.0, eps_cal=2.0,
                           sampler=sampler("fixed", 0.5, 6))
    assert one_round(fixed, fake_grid_cls([1, 2], step_handler(), fail_nodes={1, 2}), model_of(0.0))[0] is None


def test_fixed_size_is_todays_round_over_the_drawn_clients(fake_grid_cls):
    n, clip = 9, 0.5
    grid = fake_grid_cls([1, 2, 3], step_handler())
    s = build_strategy("fl", list(range(n)), "x", dp=True, clip_norm=clip, eps_cal=1e6, sampler=sampler("fixed", 1 / 3, n))
    arrays, metrics, _ = one_round(s, grid, model_of(0.0))
    assert metrics["num-contributors"] == 3
    np.testing.assert_allclose(to_numpy(arrays)["w"], clip / 3, atol=1e-5)  # the mean of 3 clipped updates
    assert metrics["sigma-abs"] == pytest.approx(calibrate_sigma_abs(clip, 3, 1e6))


def test_sequential_dfl_chains_only_the_drawn_clients_in_client_order(fake_grid_cls):
    seen: list[int] = []
    grid = fake_grid_cls([5, 6, 7], step_handler(chain=True, seen=seen))
    s = build_strategy("sequential-dfl", list(range(10)), "x", sampler=sampler("fixed", 0.4, 10, 2))
    arrays, metrics, _ = one_round(s, grid, model_of(0.0))
    drawn = [int(i) for i in s.sampler.clients(1)]
    assert seen == drawn and len(drawn) == 4
    np.testing.assert_array_equal(to_numpy(arrays)["w"], 4.0)  # four hops, one step each
    assert metrics["num-contributors"] == 4 and metrics["num-failed"] == 0


@pytest.mark.parametrize("scheme", ["poisson", "fixed"])
@pytest.mark.parametrize("framework", ["fl", "sequential-dfl"])
def test_a_sampler_at_q_1_is_full_participation_bit_for_bit(fake_grid_cls, tmp_path, framework, scheme):
    """Everyone drawn, D = N: the same release as without a sampler (same seeded noise, same bits)."""
    secret = tmp_path / "noise.seed"
    secret.write_text("s")
    outs = []
    rng = np.random.default_rng(0)
    models = {c: OrderedDict((k, rng.normal(size=sh).astype(np.float32)) for k, sh in SHAPES.items()) for c in range(5)}

    def handler(node, msg):
        cids = [int(c) for c in msg.content["config"]["client-ids"]]
        received = to_numpy(msg.content["arrays"])
        out = RecordDict()
        if framework == "fl":
            for c in cids:
                out[client_key(c)] = from_numpy(models[c])
        else:
            out[client_key(cids[-1])] = from_numpy(OrderedDict((k, v + models[cids[0]][k]) for k, v in received.items()))
        out["metrics"] = MetricRecord({"num-examples": 10, "train-loss": 1.0, "client-ids": cids})
        return Message(out, reply_to=msg)

    for smp in (None, sampler(scheme, 1.0, 5)):
        s = build_strategy(framework, list(range(5)), "x", dp=True, clip_norm=0.7, eps_cal=2.0,
                           noise=NoiseSource(str(secret)), stream=(1,), sampler=smp)
        arrays, metrics, _ = one_round(s, fake_grid_cls([1, 2], handler), model_of(0.1))
        outs.append((to_numpy(arrays), metrics["sigma-abs"]))
    (a, sa), (b, sb) = outs
    assert sa == sb and all(np.array_equal(a[k], b[k]) for k in SHAPES)


def test_canaries_are_drawn_like_clients_and_a_canary_only_round_releases_them(fake_grid_cls):
    """An audit under Poisson sampling: the inserted canaries are the draw's extra members."""
    dim = sum(int(np.prod(s)) for s in SHAPES.values())
    canaries = make_canaries(4, dim, 1.0, np.random.default_rng(5))  # 2 inserted, at norm C
    n = 3
    for seed in range(40):  # find a draw with canaries and no client in round 1
        probe = sampler("poisson", 0.5, n, seed, extra=2)
        if probe.clients(1).size == 0 and probe.extras(1).size > 0:
            break
    smp = sampler("poisson", 0.5, n, seed, extra=2)
    grid = fake_grid_cls([1], step_handler())
    s = build_strategy("fl", list(range(n)), "x", dp=True, clip_norm=1.0, eps_cal=1e6, canaries=canaries, sampler=smp)
    arrays, metrics, msgs = one_round(s, grid, model_of(0.0))
    present = canaries.inserted_indices()[smp.extras(1)]
    assert msgs == [] and metrics["num-canaries"] == present.size and metrics["num-contributors"] == 0
    flat = np.concatenate([to_numpy(arrays)[k].ravel() for k in SHAPES]).astype(np.float64)
    # their sum over the fixed denominator q (N + K_in) = 2.5 (noise negligible at eps_cal 1e6)
    np.testing.assert_allclose(flat, canaries.vectors[present].sum(axis=0) / 2.5, atol=1e-4)
    assert metrics["sigma-abs"] == pytest.approx(calibrate_sigma_abs(1.0, 2.5, 1e6))


def test_build_strategy_refuses_a_sampler_that_does_not_fit():
    with pytest.raises(ValueError, match="draws from 4 clients"):
        build_strategy("fl", [0, 1, 2], "x", sampler=sampler("poisson", 0.5, 4))
    canaries = make_canaries(4, 9, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="inserts 2 canaries"):
        build_strategy("fl", [0, 1, 2], "x", dp=True, clip_norm=1.0, eps_cal=1.0, canaries=canaries,
                       sampler=sampler("poisson", 0.5, 3))
