"""Strategy tests with a fake grid: aggregation math, token order, DP wrapper, failures."""

from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from scipy import stats

from privacy.mechanisms import calibrate_sigma_abs
from privacy.randomness import NoiseSource
from strategies.cohorts import config_record, plan_cohorts
from strategies.fedavg_equal import EqualWeightFedAvg
from strategies.matched_perturbation import MatchedPerturbation
from strategies.records import client_key, from_numpy, to_numpy
from strategies.registry import FRAMEWORKS, build_strategy, supports_dp
from strategies.sequential import SequentialDFL

SHAPES = {"w": (2, 3), "b": (3,)}
#: (framework, dp) for every registered framework, with DP only where it has a DP variant
WITH_DP = [(f, dp) for f in sorted(FRAMEWORKS) for dp in (False, True) if not dp or supports_dp(f)]


def one_model_per_client(framework: str) -> bool:
    """Whether the framework's clients each return a model (a mean), or pass one token along (a chain)."""
    return framework == "fl" or (framework in FRAMEWORKS and FRAMEWORKS[framework][0].array_claims == "each")


def model_of(value: float) -> OrderedDict:
    return OrderedDict((k, np.full(s, value, dtype=np.float32)) for k, s in SHAPES.items())


def make_handler(framework: str, client_models: dict[int, OrderedDict] | None = None, step: float = 1.0,
                 recorder: list | None = None):
    """A fake ClientApp: FL clients return their fixed model (or received + step*(cid+1));
    chain clients add step to what they received and record what they received."""

    def handler(node: int, msg: Message) -> Message:
        received = to_numpy(msg.content["arrays"])
        cids = [int(c) for c in msg.content["config"]["client-ids"]]
        out = RecordDict()
        model = OrderedDict((k, v.copy()) for k, v in received.items())
        for cid in cids:
            if recorder is not None:
                recorder.append((cid, OrderedDict((k, v.copy()) for k, v in model.items())))
            if one_model_per_client(framework):
                m = client_models[cid] if client_models else OrderedDict(
                    (k, v + step * (cid + 1)) for k, v in received.items())
                out[client_key(cid)] = from_numpy(m)
            else:
                model = OrderedDict((k, v + step) for k, v in model.items())
        if not one_model_per_client(framework):
            out[client_key(cids[-1])] = from_numpy(model)
        out["metrics"] = MetricRecord({"num-examples": 10 * len(cids), "train-loss": 1.0, "client-ids": cids})
        return Message(out, reply_to=msg)

    return handler


def one_round(strategy, grid, arrays: OrderedDict, rnd: int = 1):
    return grid.run_round(strategy, arrays, rnd)[:2]


def test_fl_aggregate_is_mean_of_client_models(fake_grid_cls):
    rng = np.random.default_rng(0)
    models = {c: OrderedDict((k, rng.normal(size=s).astype(np.float32)) for k, s in SHAPES.items()) for c in range(5)}
    grid = fake_grid_cls([11, 12, 13], make_handler("fl", models))
    arrays, metrics = one_round(EqualWeightFedAvg(list(range(5)), "x", clients_per_message=2), grid, model_of(0))
    agg = to_numpy(arrays)
    for k in SHAPES:
        np.testing.assert_allclose(agg[k], np.mean([models[c][k] for c in range(5)], axis=0), rtol=1e-6)
    assert metrics["num-contributors"] == 5 and metrics["num-failed"] == 0


def test_fl_equal_weights_ignore_num_examples(fake_grid_cls):
    # client 0 is sent alone (10 examples), clients 1-3 together (30): weights must still be equal
    models = {0: model_of(0.0), 1: model_of(1.0), 2: model_of(2.0), 3: model_of(3.0)}
    grid = fake_grid_cls([1, 2], make_handler("fl", models))
    s = EqualWeightFedAvg([0, 1, 2, 3], "x", clients_per_message=3)
    arrays, _ = one_round(s, grid, model_of(0))
    np.testing.assert_allclose(to_numpy(arrays)["w"], 1.5)


def test_sequential_client_receives_previous_output(fake_grid_cls):
    seen: list = []
    grid = fake_grid_cls([5, 6, 7, 8], make_handler("dfl", recorder=seen, step=1.0))
    s = SequentialDFL([0, 1, 2, 3], "x", clients_per_message=1)
    arrays, metrics = one_round(s, grid, model_of(10.0))
    assert [c for c, _ in seen] == [0, 1, 2, 3]  # fixed order
    for i, (_, received) in enumerate(seen):
        np.testing.assert_array_equal(received["w"], 10.0 + i)  # client i got client i-1's output exactly
    np.testing.assert_array_equal(to_numpy(arrays)["w"], 14.0)
    assert [n for n, _ in grid.log] == [5, 6, 7, 8]  # one message per hop, in order
    assert metrics["num-contributors"] == 4


def test_sequential_skips_failed_hop_and_passes_token(fake_grid_cls):
    seen: list = []
    grid = fake_grid_cls([5, 6, 7], make_handler("dfl", recorder=seen), fail_nodes={6})
    s = SequentialDFL([0, 1, 2], "x")
    arrays, metrics = one_round(s, grid, model_of(0.0))
    assert [c for c, _ in seen] == [0, 2]
    np.testing.assert_array_equal(seen[1][1]["w"], 1.0)  # client 2 received client 0's output
    np.testing.assert_array_equal(to_numpy(arrays)["w"], 2.0)
    assert metrics["num-contributors"] == 2 and metrics["num-failed"] == 1


@pytest.mark.parametrize("framework,dp", WITH_DP)
def test_contract_every_strategy_handles_all_failed(fake_grid_cls, framework, dp):
    grid = fake_grid_cls([1, 2], make_handler(framework), fail_nodes={1, 2})
    s = build_strategy(framework, [0, 1], "x", dp=dp, clip_norm=1.0, eps_cal=1.0)
    arrays, metrics = one_round(s, grid, model_of(0.0))
    assert arrays is None  # model unchanged, no release, no noise needed
    assert metrics["num-contributors"] == 0


@pytest.mark.parametrize("framework,dp", WITH_DP)
def test_contract_keys_and_shapes_preserved(fake_grid_cls, framework, dp):
    grid = fake_grid_cls([1, 2, 3], make_handler(framework))
    s = build_strategy(framework, [0, 1, 2], "x", dp=dp, clip_norm=0.5, eps_cal=2.0)
    arrays, _ = one_round(s, grid, model_of(0.0))
    out = to_numpy(arrays)
    assert list(out) == list(SHAPES)
    assert all(out[k].shape == SHAPES[k] and out[k].dtype == np.float32 for k in SHAPES)


@pytest.mark.parametrize("framework", [f for f in sorted(FRAMEWORKS) if one_model_per_client(f)])
def test_contract_mean_with_equal_example_counts_is_the_equal_mean(fake_grid_cls, framework):
    # every client reports 10 examples (make_handler): any weighting gives the plain mean of 1, 2, 3
    grid = fake_grid_cls([1, 2, 3], make_handler(framework, step=1.0))
    arrays, metrics = one_round(build_strategy(framework, [0, 1, 2], "x"), grid, model_of(0.0))
    np.testing.assert_allclose(to_numpy(arrays)["w"], 2.0, rtol=1e-6)
    assert metrics["num-contributors"] == 3 and metrics["num-failed"] == 0


@pytest.mark.parametrize("framework", [f for f in sorted(FRAMEWORKS) if not supports_dp(f)])
def test_contract_framework_without_dp_variant_refuses_dp(framework):
    with pytest.raises(ValueError, match="no DP variant"):
        build_strategy(framework, [0, 1], "x", dp=True, clip_norm=1.0, eps_cal=1.0)


def test_dp_fl_clips_each_update_and_adds_calibrated_noise(fake_grid_cls):
    n_clients, clip = 4, 0.5
    grid = fake_grid_cls([1, 2, 3, 4], make_handler("fl", step=1.0))
    s = build_strategy("fl", list(range(n_clients)), "x", dp=True, clip_norm=clip, eps_cal=1e6)
    arrays, metrics = one_round(s, grid, model_of(0.0))
    # eps_cal huge -> negligible noise: result = mean of clipped updates; each update is (cid+1)*ones(9),
    # all with norm > 0.5, so each clipped update is 0.5 * ones/3 -> mean 1/6 per coordinate.
    np.testing.assert_allclose(to_numpy(arrays)["w"], clip / 3, atol=1e-5)
    assert metrics["clip-count"] == 4 and metrics["clip-fraction"] == 1.0
    assert metrics["sigma-abs"] == pytest.approx(calibrate_sigma_abs(clip, 4, 1e6))


def test_dp_dfl_clips_round_update_once(fake_grid_cls):
    grid = fake_grid_cls([1, 2, 3], make_handler("dfl", step=1.0))
    s = build_strategy("sequential-dfl", [0, 1, 2], "x", dp=True, clip_norm=0.3, eps_cal=1e6)
    arrays, metrics = one_round(s, grid, model_of(0.0))
    np.testing.assert_allclose(to_numpy(arrays)["w"], 0.3 / 3, atol=1e-5)  # v - w = 3*ones(9), norm 9
    assert metrics["clip-total"] == 1 and metrics["clip-count"] == 1
    assert len(s.clip_events) == 1 and s.clip_events[0]["norm"] == pytest.approx(9.0)


def test_dp_noise_sd_matches_sigma_abs_statistically(fake_grid_cls):
    """Big model, updates of zero: the released model is pure noise with SD sigma_abs."""
    shapes = {"w": (300, 300)}
    zero = OrderedDict((k, np.zeros(s, np.float32)) for k, s in shapes.items())
    models = {c: zero for c in range(4)}
    grid = fake_grid_cls([1, 2], make_handler("fl", models))
    s = build_strategy("fl", list(range(4)), "x", clients_per_message=2, dp=True, clip_norm=1.0, eps_cal=2.0)
    arrays, metrics = one_round(s, grid, zero)
    z = to_numpy(arrays)["w"].astype(float).ravel()
    sigma = calibrate_sigma_abs(1.0, 4, 2.0)
    stat = np.sum(z ** 2) / sigma ** 2
    assert 2 * min(stats.chi2.cdf(stat, z.size), stats.chi2.sf(stat, z.size)) > 1e-3
    assert metrics["sigma-abs"] == pytest.approx(sigma)


def test_dp_never_under_noised_when_a_client_fails(fake_grid_cls):
    """4 clients configured, 1 fails: noise is calibrated for the 3 that replied (larger SD)."""
    shapes = {"w": (200, 200)}
    zero = OrderedDict((k, np.zeros(s, np.float32)) for k, s in shapes.items())
    grid = fake_grid_cls([1, 2, 3, 4], make_handler("fl", {c: zero for c in range(4)}), fail_nodes={2})
    s = build_strategy("fl", list(range(4)), "x", dp=True, clip_norm=1.0, eps_cal=2.0)
    arrays, metrics = one_round(s, grid, zero)
    sigma3 = calibrate_sigma_abs(1.0, 3, 2.0)
    assert metrics["num-contributors"] == 3
    assert metrics["sigma-abs"] == pytest.approx(sigma3)
    assert metrics["sigma-abs"] > calibrate_sigma_abs(1.0, 4, 2.0)
    z = to_numpy(arrays)["w"].astype(float).ravel()
    assert z.std() == pytest.approx(sigma3, rel=0.02)


def test_dp_noise_reproducible_only_with_a_local_seed_file(fake_grid_cls, tmp_path):
    secret = tmp_path / "noise.seed"
    secret.write_text("3f2a9c")
    outs = {}
    for mode, noise in [("seeded", NoiseSource(str(secret))), ("seeded", NoiseSource(str(secret))),
                        ("secure", NoiseSource()), ("secure", None)]:
        grid = fake_grid_cls([1, 2], make_handler("fl"))
        s = build_strategy("fl", [0, 1], "x", dp=True, clip_norm=1.0, eps_cal=1.0, noise=noise, stream=(5,))
        outs.setdefault(mode, []).append(to_numpy(one_round(s, grid, model_of(0.0))[0])["w"])
    np.testing.assert_array_equal(outs["seeded"][0], outs["seeded"][1])
    assert not np.array_equal(outs["secure"][0], outs["secure"][1])


def test_silent_node_times_out_and_is_treated_as_failed(fake_grid_cls):
    grid = fake_grid_cls([1, 2], make_handler("fl"), silent_nodes={2})
    s = EqualWeightFedAvg([0, 1], "x")
    g = s.prepare_grid(grid)
    msgs = list(s.configure_train(1, from_numpy(model_of(0.0)), ConfigRecord(), g))
    replies = g.send_and_receive(msgs, timeout=0.2)
    arrays, metrics = s.aggregate_train(1, replies)
    assert metrics["num-contributors"] == 1 and metrics["num-failed"] == 1


def test_plan_cohorts_and_errors():
    assert plan_cohorts([0, 1, 2, 3, 4], [9, 3], 2) == [(3, [0, 1]), (9, [2, 3]), (3, [4])]
    with pytest.raises(ValueError, match="clients_per_message"):
        plan_cohorts([0], [1], 0)
    with pytest.raises(ValueError, match="no SuperNodes"):
        plan_cohorts([0], [], 1)
    with pytest.raises(ValueError, match="unknown framework"):
        build_strategy("gossip", [0], "x")
    assert "run-config" in config_record({"a": 1})


def test_matched_perturbation_rejects_bad_arguments():
    with pytest.raises(ValueError, match="clip_at"):
        MatchedPerturbation(EqualWeightFedAvg([0], "x"), 1.0, 1.0, 1e-5, "nowhere")
    with pytest.raises(ValueError, match="clip_norm"):
        MatchedPerturbation(EqualWeightFedAvg([0], "x"), 0.0, 1.0, 1e-5, "client")


def test_pattern_strategies_run_the_server_math_on_one_blas_thread(monkeypatch):
    """Idle OpenBLAS workers spin after each call and take a core from the evaluation (issue 37's audit
    overhead): the round loop runs with one BLAS thread, and the limit ends with it."""
    from flwr.serverapp.strategy import Strategy
    from threadpoolctl import threadpool_info

    from strategies.registry import build_strategy

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    seen: list[list[int]] = []
    monkeypatch.setattr(Strategy, "start", lambda self, *args, **kwargs: seen.append(blas_threads()))
    before = blas_threads()
    build_strategy("fl", [0, 1], "x", dp=True, clip_norm=1.0, eps_cal=1.0).start(object(), None)
    assert seen and all(n == 1 for n in seen[0]) and blas_threads() == before
