"""The dfl-dp study's validated config (a frozen dataclass built once from the run config)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flower_apps.config import check_study_fault, need
from flower_apps.dfl_dp.study import ACTION, KEYS, STUDY  # noqa: F401  (ACTION, STUDY: re-exported)

PRESETS: dict[str, dict[str, Any]] = {
    # The paper: N = 100, T = 100, full MNIST when present (else the offline subset, logged).
    "paper": {},
    # Seconds on a laptop: for tests and a first look.
    "smoke": {"dataset": "mnist-5k", "num-clients": 10, "num-rounds": 2, "data-fraction": 0.5,
              "clients-per-message": 5},
    # The reduced grid's per-run settings (minutes for the whole grid on 2 cores).
    "reduced": {"dataset": "mnist", "num-clients": 100, "num-rounds": 20, "clients-per-message": 50},
    # Protocol-scale split (40,000/5,000/10,000/5,000) on data that is available offline. All 100 clients
    # in one message: the fastest transport measured for both frameworks (README, round benchmark; the
    # clients still train one after the other in DFL), and the setting the kept protocol runs used.
    "protocol-fashion": {"dataset": "fashion-mnist", "num-clients": 100, "num-rounds": 100,
                         "clients-per-message": 100},
}


if TYPE_CHECKING:  # the fields KEYS.config_class derives, written out for the type checker
    from flower_apps.dfl_dp.config_fields import DflDpConfigFields as _Fields
else:
    _Fields = object


class _DflDpRun(_Fields):
    """What a dfl-dp run derives from its fields (one field per key of KEYS, flower_apps/dfl_dp/study.py)."""

    @property
    def victim_round(self) -> int:
        """The round whose pre-update model states and gradients are captured (0 = the last)."""
        return self.attack_round or self.num_rounds

    @property
    def condition(self) -> str:
        """'nodp' or 'C{C}_eps{eps}' (used in run names and tables)."""
        return "nodp" if not self.dp else f"C{self.clip_norm:g}_eps{self.eps_cal:g}"

    @property
    def default_run_name(self) -> str:
        shadow = "_shadow" if self.data_part == "shadow" else ""
        audit = f"_audit{self.audit_canaries}" if self.audit_canaries else ""  # own folder: not resumed as plain
        fault = f"_FAULT-{self.dp_fault}" if self.dp_fault else ""  # a broken mechanism never shares a folder
        return (f"{self.framework}_{self.condition}_N{self.num_clients}_T{self.num_rounds}_{self.dataset}"
                f"_s{self.seed}{shadow}{audit}{fault}")


if TYPE_CHECKING:
    DflDpConfig = _DflDpRun
else:
    DflDpConfig = KEYS.config_class("DflDpConfig", base=_DflDpRun,
                                    doc="Everything one dfl-dp run needs (a field per key); built by build_config.")


def build_config(c: dict[str, Any]) -> DflDpConfig:
    """Validate the flat run config (kebab-case keys) and build the dataclass."""
    cfg = KEYS.build(DflDpConfig, c)  # every single-key check (flower_apps/dfl_dp/study.py)
    need(cfg.capture_victims <= cfg.num_clients, "capture-victims",
         f"must be an integer in [0, num-clients], got {cfg.capture_victims}")
    need(cfg.attack_round <= cfg.num_rounds, "attack-round",
         f"must be an integer in [0, num-rounds] (0 = last round), got {cfg.attack_round}")
    need(cfg.audit_canaries == 0 or cfg.dp, "audit-canaries", "an audit measures a DP mechanism: it needs dp = true")
    check_study_fault(cfg.dp_fault, STUDY, cfg.dp)
    need(cfg.audit_canaries % 2 == 0 and cfg.audit_canaries != 2, "audit-canaries",
         f"must be 0 or an even number >= 4 (half inserted, half held out; each half split in two), "
         f"got {cfg.audit_canaries}")
    if cfg.dp:
        check_accountant(cfg)
    return cfg


def check_accountant(cfg: DflDpConfig) -> None:
    """Refuse (ConfigError) DP settings the run's accountant cannot account for, before any work.

    The same call the ServerApp makes for the summary (``privacy.accounting.account``): a noise
    multiplier it divides by zero on (eps-cal=1e300), an epsilon that is not finite, or a sigma_abs
    that is 0 or inf in the float32 model (flower_apps/accountable.py says which values work).
    """
    from flower_apps.accountable import noise_sd_error, refuse_unaccountable
    from privacy.accounting import account

    def epsilon(v: dict[str, Any]) -> float:
        row = account(cfg.framework, v["clip-norm"], v["eps-cal"], v["num-clients"], v["num-rounds"],
                      v["delta-cal"], v["delta-total"])
        bad = noise_sd_error("sigma_abs", row.sigma_abs)
        if bad:
            raise ValueError(bad)
        return max(row.eps_total, row.eps_rdp_accountant)

    values = {"clip-norm": cfg.clip_norm, "eps-cal": cfg.eps_cal, "delta-cal": cfg.delta_cal,
              "delta-total": cfg.delta_total, "num-clients": cfg.num_clients, "num-rounds": cfg.num_rounds}
    refuse_unaccountable(KEYS.keys, values, epsilon, "the client-level RDP accountant (privacy/accounting.py)")
