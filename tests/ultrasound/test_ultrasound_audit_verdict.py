"""Issue 37, ultrasound: the white-box gradient-canary audit of DP-SGD has a verdict that fails on a broken optimizer.

The faults (privacy/faults.py: the DP optimizer's noise multiplier 2x / 10x smaller than the ledger's) act
in the client's real Opacus optimizer; the audit reads the noised gradient sums of every step along its
canaries and compares them with the configured z C. Noise is seeded (a local seed file), so every run here
is reproducible and the verdicts are fixed, not drawn.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from flower_apps.common.results import read_json
from flower_apps.config import ConfigError
from flower_apps.ultrasound import audit_trial, gradient_audit
from flower_apps.ultrasound.study import NOISE_SEED_ENV
from privacy.dpsgd import GradientCanaries, make_private
from privacy.faults import ALLOW_ENV
from privacy.randomness import NoiseSource

FAULTS = ("", "dpsgd-noise-div-2", "dpsgd-noise-div-10")
EXPECTED = {"": "consistent", "dpsgd-noise-div-2": "violation", "dpsgd-noise-div-10": "violation"}


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread (the 2-core machine is shared: two spinning OpenMP threads cost 10x the wall time)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def seeded(tmp_path, monkeypatch):
    """Faults allowed; each client's DP-SGD noise from a local seed file (bit-reproducible runs)."""
    secret = tmp_path / "noise-seed"
    secret.write_text("a local secret of the audit tests")
    monkeypatch.setenv(ALLOW_ENV, "1")
    monkeypatch.setenv(NOISE_SEED_ENV, str(secret))
    return secret


def _canaries(m: int, included: np.ndarray, seed: int = 0) -> GradientCanaries:
    return GradientCanaries(included, 1.5, np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2]))


def _one_step(gc: GradientCanaries | None, z: float, secret) -> tuple[list[torch.Tensor], object]:
    """One DP-SGD step of a tiny linear model through make_private (ghost clipping, Poisson rate 1/2)."""
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pt = make_private(model, opt, 32, 16, noise_multiplier=z, max_grad_norm=1.5, grad_sample_mode="ghost",
                          noise=NoiseSource(str(secret)), gradient_canaries=gc)
    x, y = torch.randn(32, 6, generator=torch.Generator().manual_seed(1)), torch.arange(32) % 3
    (idx,) = next(iter(pt.loader))
    from privacy.dpsgd import ghost_clipping_backward

    xb = x[idx].requires_grad_(True)
    ghost_clipping_backward(pt.model, nn.functional.cross_entropy(pt.model(xb), y[idx], reduction="none"), xb)
    assert pt.optimizer.pre_step()
    return [p.grad.detach().clone() * pt.optimizer.expected_batch_size for p in model.parameters()], pt


def test_canaries_enter_the_clipped_sum_before_the_optimizers_own_noise_and_are_read_after_it(seeded):
    included = np.array([True, False] * 8)
    plain, _ = _one_step(None, 2.0, seeded)
    gc = _canaries(16, included)
    audited, pt = _one_step(gc, 2.0, seeded)
    flat_plain, flat_audited = torch.cat([g.reshape(-1) for g in plain]), torch.cat([g.reshape(-1) for g in audited])
    assert gc.steps == 1 and gc.dim == flat_plain.numel() == 21 and math.isclose(gc.sample_rate, 0.5)
    added = np.zeros(21)
    coords = np.sort(np.random.default_rng([0, 1]).choice(21, 16, replace=False))  # the canaries' coordinates
    mask = gc.sampled[0]
    added[coords[mask & included]] = 1.5  # exactly C along each inserted canary sampled in this step, nothing else
    # the same noise draws (same seed file): the difference is the canaries alone; the noise is the optimizer's
    assert torch.allclose(flat_audited - flat_plain, torch.from_numpy(added).float(), atol=1e-5)
    assert np.allclose(gc.projections[0], flat_audited.numpy()[coords], atol=1e-5)  # what the auditor reads
    assert type(pt.optimizer).__name__.startswith("GradientCanary")
    _, pt_plain = _one_step(None, 2.0, seeded)
    assert not hasattr(pt_plain.optimizer, "gradient_canaries")  # no audit: Opacus' optimizer as before


def test_the_fault_shrinks_the_optimizers_noise_and_leaves_the_ledger_and_reports_at_the_configured_z(seeded):
    from flower_apps.router import prepare
    from flower_apps.ultrasound.client_app import dp_settings

    for fault, k in (("", 1.0), ("dpsgd-noise-div-2", 2.0), ("dpsgd-noise-div-10", 10.0)):
        cfg = prepare({"study": "ultrasound", "preset": "smoke", "us-dp-sgd": True, "dp-fault": fault})[1]
        dp = dp_settings(cfg)
        assert dp.noise_multiplier == cfg.noise_multiplier == 2.0 and dp.noise_divisor == k  # ledger's z unchanged
    # train_local (the client's training) hands z / k to the optimizer: its noise, read along 64 held-out
    # canary coordinates of a 6k-parameter model over 60 steps, is z C, or z C / 10 under the fault
    from flower_apps.ultrasound.train import DpSettings, train_local

    x = torch.randint(0, 256, (32, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    y = torch.arange(32) % 2
    measured = {}
    for k in (1.0, 10.0):
        gc = _canaries(64, np.zeros(64, dtype=bool))  # all held out: nothing inserted, only read
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 2))
        dp = DpSettings(2.0, 1.5, noise=NoiseSource(str(seeded)), noise_divisor=k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            train_local(model, x, y, epochs=30, batch_size=16, lr_for_epoch=lambda e: 1e-3,
                        device=torch.device("cpu"), seed=0, dp=dp, feature_cache=False, gradient_canaries=gc)
        measured[k] = float(np.sqrt(np.mean(np.asarray(gc.projections) ** 2)) / (2.0 * 1.5))
        assert gc.steps >= 40
    assert abs(measured[1.0] - 1) < 0.1 and abs(measured[10.0] - 0.1) < 0.015, measured


def test_the_gradient_kind_needs_dp_sgd_with_noise_and_a_fault_needs_permission(monkeypatch):
    from flower_apps.router import prepare

    base = {"study": "ultrasound", "preset": "smoke", "us-audit-canaries": 64, "us-audit-canary": "gradient"}
    with pytest.raises(ConfigError, match="us-audit-canary: 'gradient' canaries .* need us-dp-sgd=true"):
        prepare(base)
    with pytest.raises(ConfigError, match="us-noise-multiplier > 0"):
        prepare({**base, "us-dp-sgd": True, "us-noise-multiplier": 0.0})
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(ConfigError, match=f"dp-fault: .*{ALLOW_ENV}=1"):
        audit_trial.audit_trial("dpsgd-noise-div-10", 0)
    cfg = prepare({**base, "us-dp-sgd": True})[1]
    assert cfg.default_run_name.endswith("_audit-gradient-m64")


def test_a_hostile_gradient_record_is_refused_before_any_arithmetic():
    gc = _canaries(4, np.array([True, False, True, False]))
    gc.sample_rate = 0.5
    gc.projections, gc.sampled = [np.ones(4), np.zeros(4)], [np.ones(4, bool), np.zeros(4, bool)]
    good = gradient_audit.gradient_record(gc, 2)
    parsed = gradient_audit.parse_gradient_record(good, 4)
    assert parsed["projections"].shape == (2, 4) and parsed["sampled"].dtype == bool
    for change, msg in (({"projections": [1.0] * 7}, "need 8 projections"),
                        ({"projections": [math.nan] * 8}, "finite"),
                        ({"sampled": [2] * 8}, "0 or 1"),
                        ({"canaries": 5}, "5 canaries, the audit has 4"),
                        ({"accountant-steps": 1}, "steps-observed <= accountant-steps"),
                        ({"sample-rate": 1.5}, "sample-rate"),
                        ({"extra": 1}, "keys")):
        rec = dict(good)
        rec.update(change)
        with pytest.raises(ValueError, match=msg):
            gradient_audit.parse_gradient_record(rec, 4)


@pytest.mark.parametrize("fault", FAULTS, ids=["correct", "div-2", "div-10"])
def test_audit_trial_at_the_smoke_preset(seeded, fault):
    # one audited client training through the real ClientApp handler and optimizer (the benchmark's unit)
    res = audit_trial.audit_trial(fault, 0, us_noise_mode="seeded")
    assert res["verdict"] == EXPECTED[fault] and res["dp_fault"] == (fault or None)
    assert res["noise_multiplier_configured"] == 2.0 and res["steps_observed"] >= 2
    k = {"": 1.0, "dpsgd-noise-div-2": 2.0, "dpsgd-noise-div-10": 10.0}[fault]
    assert abs(res["measured_over_configured"] * k - 1) < 0.15  # the noise the optimizer actually added
    if fault:
        assert "measured-noise" in res["fired"]
    else:
        assert res["fired"] == [] and "measured-noise" in res["powered"]


def test_gradient_audit_through_the_flower_simulation_gives_each_run_its_verdict(tmp_path, seeded):
    # the smoke preset, one simulation: the correct optimizer and both faults, audited through server_main and the
    # ClientApp (the audit record rides in client 0's reply and is taken out before the strategy sees it)
    from flower_apps.common.sweep import audit_violations
    from flower_apps.router import prepare
    from flower_apps.ultrasound import sweep
    from flower_apps.ultrasound.report import write_report
    from flower_apps.ultrasound.server_app import run_dir

    cfgs = [prepare({"study": "ultrasound", "preset": "smoke", "us-dp-sgd": True, "us-noise-mode": "seeded",
                     "us-audit-canaries": gradient_audit.DEFAULT_GRADIENT_CANARIES, "us-audit-canary": "gradient",
                     "dp-fault": f, "results-dir": str(tmp_path)})[1] for f in FAULTS]
    sweep._run(cfgs, sweep.parse_args(["--results-dir", str(tmp_path)]))
    for cfg, fault in zip(cfgs, FAULTS):
        out = run_dir(cfg)
        res, summary = read_json(out / "audit.json"), read_json(out / "summary.json")
        assert res["verdict"] == EXPECTED[fault], (fault, res["fired"], res["measured_over_configured"])
        assert res["rounds_scored"] == cfg.num_rounds == 2 and summary["audit"] == res
        # the ledger keeps the configured z under the fault: the accountant's epsilon equals the audit's reference
        assert summary["accounting"]["noise_multiplier"] == 2.0
        assert math.isclose(summary["accounting"]["per_client"][0]["eps_rdp"], res["eps_formal_rdp"], rel_tol=1e-9)
        assert summary.get("dp_fault") == (fault or None)
    line = audit_violations("ultrasound", cfgs)
    assert line.startswith("AUDIT VIOLATION in ultrasound: 2 run(s)") and "FAULT-dpsgd-noise-div-10" in line
    md = write_report(tmp_path)
    assert "verdict" in md and "violation (measured-noise" in md
    assert "consistent" in md and "noise measured / configured" in md
