import json
import math
import subprocess
import sys

import numpy as np
import pytest
from opacus.accountants.analysis import rdp as opacus_rdp
from scipy import optimize

from privacy import accounting
from privacy.accounting import account, rdp_standard_epsilon


@pytest.mark.parametrize("z,t", [(1.2112, 100), (4.8448, 100), (0.6, 20), (12.0, 5)])
def test_standard_conversion_matches_independent_minimization(z, t):
    """Independent: minimise rdp(alpha) + ln(1/delta)/(alpha-1) numerically over Opacus' RDP curve."""
    delta = 1e-5

    def objective(a):
        r = float(opacus_rdp.compute_rdp(q=1.0, noise_multiplier=z, steps=t, orders=[a])[0])
        return r + math.log(1 / delta) / (a - 1)

    res = optimize.minimize_scalar(objective, bounds=(1.0001, 1e4), method="bounded", options={"xatol": 1e-10})
    eps, alpha = rdp_standard_epsilon(z, t, delta)
    assert eps == pytest.approx(res.fun, rel=1e-6)
    assert alpha == pytest.approx(res.x, rel=1e-3)
    # closed form of the Gaussian case: rho + 2 sqrt(rho ln(1/delta))
    rho = t / (2 * z * z)
    assert eps == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / delta)), rel=1e-9)


def test_tighter_accountants_are_tighter_where_valid():
    row = account("fl", 1.0, 2.0, 100, 100)
    assert row.noise_multiplier == pytest.approx(row.sigma_abs / row.sensitivity)
    assert not row.rdp_order_at_grid_edge
    assert row.eps_gdp_exact < row.eps_rdp_accountant < row.eps_total


def test_dfl_sensitivity_makes_budget_explode():
    fl = account("fl", 1.0, 2.0, 100, 100)
    dfl = account("sequential-dfl", 1.0, 2.0, 100, 100)
    assert dfl.sigma_abs == pytest.approx(fl.sigma_abs)  # matched noise
    assert dfl.sensitivity == pytest.approx(100 * fl.sensitivity)
    assert dfl.eps_total > 1000 * fl.eps_total
    assert dfl.eps_gdp_exact is None  # outside Opacus' bracket, reported as such


def test_cli_json_has_required_keys_and_whole_grid():
    out = subprocess.run([sys.executable, "-m", "privacy.accounting", "--json", "-T", "10"], capture_output=True,
                         text=True, check=True).stdout
    rows = json.loads(out)
    assert len(rows) == 2 * 4 * 5
    for key in ("framework", "clip_norm", "eps_cal", "num_clients", "num_rounds", "sigma_abs", "sensitivity",
                "eps_total", "delta_total"):
        assert key in rows[0]
    assert {r["framework"] for r in rows} == {"fl", "sequential-dfl"}
    assert all(r["num_rounds"] == 10 and r["num_clients"] == 100 for r in rows)


def test_cli_rejects_bad_flags():
    p = subprocess.run([sys.executable, "-m", "privacy.accounting", "--num-clients", "1"], capture_output=True, text=True)
    assert p.returncode != 0 and "--num-clients must be >= 2" in p.stderr


def test_eps_decreases_with_more_noise():
    eps = [account("fl", 1.0, e, 100, 50).eps_total for e in (0.5, 1, 2, 4)]
    assert np.all(np.diff(eps) > 0)  # larger eps_cal = less noise = larger budget
    assert accounting.PAPER_CLIP_NORMS == (0.1, 0.5, 1.0, 2.0)
