"""Per-client (eps, delta) of the tabular-pdp study's GDP and PDP releases (beyond the paper).

Model: the server is trusted; what is released each round is the aggregate
w(t+1) = w(t) + sum_j p_j (clip(Delta_j) + z_j) (PDP) or w(t) + sum_j p_j clip(Delta_j) + z (GDP).
Client i's contribution p_i clip(Delta_i) has L2 norm at most p_i C (add/remove-one client
with the weights taken as public, the convention of Flower's and McMahan et al.'s
accounting). The release's noise is Gaussian with SD sigma_rel = n_eps C / m (GDP) or
sqrt(sum_j p_j^2 sigma_j^2) (PDP: the sum of independent draws), so each round is a Gaussian
mechanism with noise multiplier z_i = sigma_rel / (p_i C) for client i, composed over the
rounds the client took part in.

For PDP we also report what the trusted server itself sees of client i (its noised
update: z = sigma_i / C); under GDP the server sees updates in the clear (eps = inf).

epsilon comes from Google's dp-accounting (``RdpAccountant`` on
``SelfComposedDpEvent(GaussianDpEvent(z), T)``) and, tighter, from the exact mu-GDP
composition via Opacus (privacy.accounting.gdp_exact_epsilon, None above 500). Flower 1.42's
own accountant (flwr.supercore.privacy_accounting) is not used: it refuses size-weighted
FedAvg (it requires equal client weights).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

from privacy.accounting import gdp_exact_epsilon, rdp_accountant_epsilon


def gaussian_epsilon(noise_multiplier: float, rounds: int, delta: float) -> dict[str, float | None]:
    """eps of ``rounds`` Gaussian releases with multiplier z (dp-accounting RDP; exact mu-GDP)."""
    if rounds == 0:
        return {"eps_rdp": 0.0, "eps_gdp_exact": 0.0}
    if not noise_multiplier > 0:
        return {"eps_rdp": math.inf, "eps_gdp_exact": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps, _ = rdp_accountant_epsilon(noise_multiplier, rounds, delta)
    return {"eps_rdp": float(eps), "eps_gdp_exact": gdp_exact_epsilon(noise_multiplier, rounds, delta)}


def client_budgets(weights: Mapping[int, float], clip_norm: float, sigma_release: float,
                   rounds: Mapping[int, int], delta: float,
                   sigma_server_view: Mapping[int, float] | None = None) -> dict[int, dict]:
    """Per-client ledger.

    Parameters
    ----------
    weights : client id -> FedAvg weight (num-examples; normalized here).
    clip_norm : C.
    sigma_release : SD of the noise in the released aggregate (the smallest over the rounds: conservative).
    rounds : client id -> number of DP rounds it contributed to.
    delta : the delta of the reported epsilons.
    sigma_server_view : PDP only: client id -> sigma_i of the noise on its own update.
    """
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    total = float(sum(weights.values()))
    sig = float(sigma_release)
    out = {}
    for cid, w in weights.items():
        p = float(w) / total
        z = sig / (p * clip_norm)
        row = {"weight": p, "sensitivity": p * clip_norm, "sigma_release": sig, "z_release": z,
               "rounds": int(rounds.get(cid, 0)), **gaussian_epsilon(z, int(rounds.get(cid, 0)), delta)}
        if sigma_server_view is not None:
            zs = sigma_server_view[cid] / clip_norm
            sv = gaussian_epsilon(zs, int(rounds.get(cid, 0)), delta)
            row.update({"z_server_view": zs, "eps_server_view_rdp": sv["eps_rdp"]})
        out[int(cid)] = row
    return out
