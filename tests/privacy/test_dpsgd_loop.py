"""privacy.dpsgd's shared pieces: sample rate, noise calibration (quiet accounting), the generic DP-SGD loop."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dp_accounting
import pytest
import torch
from absl import logging as absl_logging
from torch import nn

from privacy.dpsgd import (
    LOOP_GRAD_SAMPLE_MODES,
    DpSgdEvent,
    make_private,
    noise_multiplier_for_epsilon,
    quiet_absl,
    rdp_epsilon,
    sample_rate,
    train_dp_sgd,
)
from privacy.randomness import NoiseSource

ROOT = Path(__file__).resolve().parents[2]
DELTA = 1e-5


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def seeded(tmp_path) -> NoiseSource:
    """A client's seeded noise source (research opt-in): same file and seed, same batches and noise."""
    f = tmp_path / "noise.seed"
    f.write_text("a local secret for the tests")
    return NoiseSource(seed_file=str(f))


def _init(model: nn.Module, seed: int) -> nn.Module:
    """Fill the parameters from a seeded generator (no global torch state)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def _images(n: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    """1-channel 8x8 random images; labels from a fixed linear teacher of the pixels."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 1, 8, 8, generator=g)
    teacher = torch.randn(64, generator=g)
    return x, (x.flatten(1) @ teacher > 0).long()


def _tabular(n: int = 200, d: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, d, generator=g)
    teacher = torch.randn(d, generator=g)
    return x, (x @ teacher > 0).long()


def _mlp() -> nn.Module:
    return _init(nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 2)), 0)


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors])


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


# ---------------------------------------------------------------- sample rate and calibration


@pytest.mark.parametrize("batch_size,n", [(10, 100), (32, 1585), (7, 10), (1, 1), (100, 100)])
def test_sample_rate_is_what_make_private_samples_with(batch_size, n):
    q = sample_rate(batch_size, n)
    assert q == 1 / math.ceil(n / batch_size)
    model = nn.Linear(2, 2)
    with pytest.warns(UserWarning, match="noise_multiplier = 0"):
        pt = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), n, batch_size, noise_multiplier=0.0,
                          max_grad_norm=1.0)
    assert pt.sample_rate == q  # the independent reference: the loader's own rate
    pt.model.cleanup()


@pytest.mark.parametrize("batch_size,n,match", [(0, 10, "batch_size"), (-1, 10, "batch_size"), (5, 0, "num_samples"),
                                                (11, 10, "batch_size must be <= num_samples"), (2.0, 10, "int")])
def test_sample_rate_rejects_bad_input(batch_size, n, match):
    with pytest.raises(ValueError, match=match):
        sample_rate(batch_size, n)


@pytest.mark.parametrize("eps,q,steps", [(1.0, 0.01, 1000), (8.0, 0.25, 20), (3.0, 1.0, 5)])
def test_calibrated_noise_reaches_the_target_from_below(eps, q, steps):
    cal = noise_multiplier_for_epsilon(eps, DELTA, q, steps)
    recomputed = rdp_epsilon([DpSgdEvent(cal.noise_multiplier, q, steps)], DELTA)
    assert recomputed == cal.epsilon
    assert 0.99 * eps <= recomputed <= eps
    # the smallest such sigma: 0.1% less noise overspends
    assert rdp_epsilon([DpSgdEvent(cal.noise_multiplier * 0.999, q, steps)], DELTA) > eps
    assert (cal.target_epsilon, cal.delta, cal.sample_rate, cal.steps, cal.accountant) == (eps, DELTA, q, steps, "rdp")


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")  # Opacus, on its way there
def test_calibration_agrees_with_opacus():
    """An independent implementation: Opacus' own RDP analysis and its get_noise_multiplier (other orders)."""
    from opacus.accountants.utils import get_noise_multiplier

    cal = noise_multiplier_for_epsilon(2.0, DELTA, 0.02, 500)
    sigma_opacus = get_noise_multiplier(target_epsilon=2.0, target_delta=DELTA, sample_rate=0.02, steps=500,
                                        accountant="rdp", epsilon_tolerance=0.001)
    assert cal.noise_multiplier == pytest.approx(sigma_opacus, rel=0.03)


@pytest.mark.parametrize("kwargs,match", [
    ({"target_epsilon": 0.0}, "target_epsilon"), ({"target_epsilon": -1.0}, "target_epsilon"),
    ({"target_epsilon": math.inf}, "target_epsilon"), ({"target_epsilon": math.nan}, "target_epsilon"),
    ({"delta": 0.0}, "delta"), ({"delta": 1.0}, "delta"), ({"delta": -1e-5}, "delta"),
    ({"sample_rate": 0.0}, "sample_rate"), ({"sample_rate": 1.5}, "sample_rate"),
    ({"steps": 0}, "steps"), ({"steps": 2.5}, "steps"), ({"accountant": "moments"}, "accountant"),
    # sigma would have to exceed 2**30: dp-accounting's search gives up, and so do we, loudly
    ({"target_epsilon": 1e-10, "sample_rate": 1.0, "steps": 10**15}, "unreachable"),
])
def test_calibration_rejects_bad_input(kwargs, match):
    args = {"target_epsilon": 1.0, "delta": DELTA, "sample_rate": 0.1, "steps": 100, **kwargs}
    with pytest.raises(ValueError, match=match):
        noise_multiplier_for_epsilon(**args)


def _absl_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "absl"]


def test_calibration_emits_no_absl_warnings_and_restores_logging(caplog):
    caplog.set_level(logging.WARNING)
    absl_logger = absl_logging.get_absl_logger()
    # the capture does see them: dp-accounting at q = 0.25 (fractional orders that do not converge)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.25, dp_accounting.GaussianDpEvent(1.0)))
    assert any("failed to converge" in r.getMessage() for r in _absl_records(caplog))
    caplog.clear()
    before = (absl_logger.level, absl_logging.get_verbosity(), list(logging.getLogger().handlers))
    noise_multiplier_for_epsilon(8.0, DELTA, 0.25, 20)
    rdp_epsilon([DpSgdEvent(1.0, 0.25, 20)], DELTA)
    assert _absl_records(caplog) == []
    assert (absl_logger.level, absl_logging.get_verbosity(), list(logging.getLogger().handlers)) == before
    # and after the context, absl warnings flow again
    absl_logging.warning("after the context")
    assert [r.getMessage() for r in _absl_records(caplog)] == ["after the context"]


def test_quiet_absl_restores_on_error_and_nests():
    absl_logger = absl_logging.get_absl_logger()
    old = absl_logger.level
    with pytest.raises(RuntimeError), quiet_absl():
        with quiet_absl():
            assert absl_logger.getEffectiveLevel() == logging.ERROR
        assert absl_logger.getEffectiveLevel() == logging.ERROR
        raise RuntimeError
    assert absl_logger.level == old


def test_calibration_is_silent_on_stderr_in_a_fresh_process():
    """Where nothing configured logging: no stderr line, and no root handler left behind (absl's log() would
    call logging.basicConfig()). The control afterwards shows both would happen without the guard."""
    code = textwrap.dedent("""
        import json, logging, sys
        from privacy.dpsgd.calibrate import noise_multiplier_for_epsilon
        from absl import logging as absl_logging
        level = absl_logging.get_absl_logger().level
        noise_multiplier_for_epsilon(8.0, 1e-5, 0.25, 20)
        quiet = {"handlers": len(logging.getLogger().handlers), "level": absl_logging.get_absl_logger().level == level}
        sys.stderr.write("--- control ---\\n"); sys.stderr.flush()
        import dp_accounting
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.PoissonSampledDpEvent(0.25, dp_accounting.GaussianDpEvent(1.0)))
        print(json.dumps({**quiet, "control_handlers": len(logging.getLogger().handlers)}))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    during, _, control = proc.stderr.partition("--- control ---\n")
    assert "absl" not in during and out["handlers"] == 0 and out["level"]
    assert "WARNING:absl:" in control and out["control_handlers"] == 1


# ---------------------------------------------------------------- the loop: input checks


def _good_kwargs() -> dict:
    return {"batch_size": 10, "noise_multiplier": 1.0, "max_grad_norm": 1.0, "steps": 2, "lr": 0.1}


@pytest.mark.parametrize("change,match", [
    ({"y": "short"}, "same number of examples"),
    ({"noise_multiplier": -0.1}, "noise_multiplier"), ({"noise_multiplier": math.nan}, "noise_multiplier"),
    ({"max_grad_norm": 0.0}, "max_grad_norm"), ({"max_grad_norm": -1.0}, "max_grad_norm"),
    ({"batch_size": 0}, "batch_size"), ({"batch_size": -3}, "batch_size"), ({"batch_size": 201}, "batch_size"),
    ({"steps": None}, "exactly one of epochs and steps"), ({"epochs": 1}, "exactly one of epochs and steps"),
    ({"steps": 0}, "steps"), ({"lr": None}, "exactly one of lr"),
    ({"optimizer": lambda ps: torch.optim.SGD(ps, lr=0.1)}, "exactly one of lr"), ({"lr": 0.0}, "lr"),
    ({"delta": 0.0}, "delta"), ({"grad_sample_mode": "ew"}, "grad_sample_mode"),
    ({"x": "nan"}, "non-finite"),
])
def test_bad_input_fails_before_any_training(change, match):
    x, y = _images()
    model = _mlp()
    before = _params(model)
    kwargs = {**_good_kwargs(), **change}
    kwargs.pop("x", None), kwargs.pop("y", None)
    if change.get("y") == "short":
        y = y[:-1]
    if change.get("x") == "nan":
        x = x.clone()
        x[3, 0, 2, 2] = math.nan
    with pytest.raises(ValueError, match=match):
        train_dp_sgd(model, x, y, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not any(hasattr(p, "grad_sample") for p in model.parameters())  # never made private


def test_a_mean_reduced_loss_is_refused_and_the_model_left_clean(seeded):
    x, y = _images()
    model = _mlp()
    with pytest.raises(ValueError, match="one loss per example"):
        train_dp_sgd(model, x, y, **_good_kwargs(), loss=nn.CrossEntropyLoss(), noise=seeded)
    assert not any(hasattr(p, a) for p in model.parameters() for a in ("grad_sample", "summed_grad"))
    assert train_dp_sgd(model, x, y, **_good_kwargs(), noise=seeded).stats.steps == 2  # usable again


# ---------------------------------------------------------------- the loop: noise, sampling, determinism


def test_same_seed_gives_bit_identical_parameters(seeded):
    x, y = _images()
    runs = [train_dp_sgd(_mlp(), x, y, **{**_good_kwargs(), "steps": 6}, seed=s, noise=seeded) for s in (4, 4, 5)]
    a, b, c = (_params(r.model) for r in runs)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert runs[0].stats == runs[1].stats
    assert not torch.equal(_flat(a), _flat(c))


def _one_full_batch_step(noise_multiplier: float, noise: NoiseSource | None, seed: int) -> torch.Tensor:
    """One SGD step (lr 1) of a 64 -> 10 linear model at q = 1: every example in every batch, in order,
    whatever the seed, so runs differ only by the DP optimizer's noise."""
    x, y = _tabular(n=32, d=64)
    model = _init(nn.Linear(64, 10), 0)
    result = train_dp_sgd(model, x, y, batch_size=32, noise_multiplier=noise_multiplier, max_grad_norm=1.0,
                          steps=1, lr=1.0, seed=seed, noise=noise)
    assert result.stats.sample_rate == 1.0 and result.stats.expected_batch_size == 32
    return _flat(_params(model))


def test_noise_is_applied_at_its_calibrated_scale(seeded):
    """theta(sigma) - theta(0) is exactly -lr * N(0, (sigma C)^2) / B per coordinate: the measured SD of 650
    coordinates matches sigma * C / B (SE of an SD estimate ~ 1 / sqrt(2 * 650) = 2.8%)."""
    with pytest.warns(UserWarning, match="noise_multiplier = 0"):
        clean = _one_full_batch_step(0.0, seeded, 0)
    noised = _one_full_batch_step(2.0, seeded, 0)
    diff = noised - clean
    assert float(diff.std()) == pytest.approx(2.0 * 1.0 / 32, rel=0.10)
    assert abs(float(diff.mean())) < 4 * (2.0 / 32) / math.sqrt(len(diff))


def test_noise_comes_from_the_clients_secret_not_from_the_inputs(tmp_path):
    """What a server knows (data layout, model, seed) does not determine the noise: with the default secret
    source the same seed gives different releases; without noise (and with fixed sampling, q = 1) any seed gives
    the same release, so the difference is the noise alone. A seeded source depends on its file's secret."""
    assert not torch.equal(_one_full_batch_step(1.0, None, 7), _one_full_batch_step(1.0, None, 7))
    with pytest.warns(UserWarning, match="noise_multiplier = 0"):
        assert torch.equal(_one_full_batch_step(0.0, None, 7), _one_full_batch_step(0.0, None, 8))
    files = [tmp_path / "a.seed", tmp_path / "b.seed"]
    for f, secret in zip(files, ("secret one", "secret two")):
        f.write_text(secret)
    a, b = (_one_full_batch_step(1.0, NoiseSource(seed_file=str(f)), 7) for f in files)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("mode", LOOP_GRAD_SAMPLE_MODES)
def test_empty_poisson_batches_take_a_pure_noise_step(seeded, mode):
    """q = 1/400 (B = 1 of n = 400): about 37% of the batches are empty. Each still takes its step, recorded in
    the ledger, and moves every parameter by -lr * N(0, (sigma C)^2) / B_expected."""
    x, y = _tabular(n=400, d=64)
    model = _init(nn.Linear(64, 10), 0)
    sigma, clip, lr, steps = 1.5, 0.5, 0.1, 12
    snapshots, sizes = [_params(model)], []

    def on_step(step, batch_len, m):
        sizes.append(batch_len)
        snapshots.append(_params(m))

    res = train_dp_sgd(model, x, y, batch_size=1, noise_multiplier=sigma, max_grad_norm=clip, steps=steps, lr=lr,
                       seed=3, noise=seeded, grad_sample_mode=mode, on_step=on_step)
    empty = [i for i, b in enumerate(sizes) if b == 0]
    assert len(sizes) == res.stats.steps == res.ledger.total_steps == steps
    assert res.stats.empty_steps == len(empty) >= 2 and res.stats.examples == sum(sizes)
    assert res.stats.expected_batch_size == 1 and res.stats.sample_rate == 1 / 400
    steps_taken = [_flat(snapshots[i + 1]) - _flat(snapshots[i]) for i in empty]
    assert all(bool((d != 0).all()) for d in steps_taken)
    pooled = torch.cat(steps_taken) / lr
    assert float(pooled.std()) == pytest.approx(sigma * clip / 1, rel=0.10)
    assert res.stats.epsilon == rdp_epsilon([DpSgdEvent(sigma, 1 / 400, steps)], DELTA)


def test_modes_agree_without_noise():
    """Per-sample gradients (hooks, functorch) and ghost norms (ghost) clip the same sum: at sigma = 0, q = 1."""
    x, y = _images(n=40)
    out = []
    for mode in LOOP_GRAD_SAMPLE_MODES:
        model = _mlp()
        with pytest.warns(UserWarning, match="noise_multiplier = 0"):
            train_dp_sgd(model, x, y, batch_size=40, noise_multiplier=0.0, max_grad_norm=0.1, steps=3, lr=0.5,
                         grad_sample_mode=mode)
        out.append(_flat(_params(model)))
    assert not torch.equal(out[0], _flat(_params(_mlp())))
    for o in out[1:]:
        torch.testing.assert_close(o, out[0], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- end to end


def test_mlp_on_8x8_images_and_linear_model_on_tabular_data_train(seeded):
    xi, yi = _images()
    mlp = _mlp()
    acc0 = _accuracy(mlp, xi, yi)
    ri = train_dp_sgd(mlp, xi, yi, batch_size=20, noise_multiplier=0.8, max_grad_norm=1.0, epochs=8, lr=0.5,
                      noise=seeded)
    assert ri.stats.steps == 8 * 10 and ri.stats.sample_rate == 0.1 and math.isfinite(ri.stats.mean_loss)
    assert _accuracy(mlp, xi, yi) >= max(acc0 + 0.2, 0.75)

    xt, yt = _tabular()
    lin = _init(nn.Linear(5, 2), 0)
    acc0 = _accuracy(lin, xt, yt)
    rt = train_dp_sgd(lin, xt, yt, batch_size=25, noise_multiplier=0.8, max_grad_norm=1.0, steps=60,
                      optimizer=lambda ps: torch.optim.Adam(ps, lr=0.05), noise=seeded)
    assert rt.stats.steps == 60 and rt.stats.sample_rate == 0.125
    assert _accuracy(lin, xt, yt) >= max(acc0 + 0.2, 0.85)
    assert not any(hasattr(p, a) for p in lin.parameters() for a in ("grad_sample", "summed_grad", "_forward_counter"))


def test_a_calibrated_noise_multiplier_trains_to_its_budget(seeded):
    x, y = _tabular(n=100)
    q, epochs = sample_rate(20, 100), 4
    cal = noise_multiplier_for_epsilon(3.0, DELTA, q, epochs * round(1 / q))
    res = train_dp_sgd(_init(nn.Linear(5, 2), 0), x, y, batch_size=20, noise_multiplier=cal.noise_multiplier,
                       max_grad_norm=1.0, epochs=epochs, lr=0.2, delta=DELTA, noise=seeded)
    assert res.stats.steps == cal.steps and res.stats.noise_multiplier == cal.noise_multiplier
    assert 0.99 * 3.0 <= res.stats.epsilon <= 3.0
    assert res.stats.epsilon == rdp_epsilon([DpSgdEvent(cal.noise_multiplier, q, cal.steps)], DELTA)
