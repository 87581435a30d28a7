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
    def sampled(self) -> bool:
        """Whether rounds sample their cohort (client-fraction < 1; privacy/sampling.py)."""
        return self.client_fraction < 1

    @property
    def default_run_name(self) -> str:
        shadow = "_shadow" if self.data_part == "shadow" else ""
        # a sampled run never shares a folder with its full-participation twin (whose name stays as it was)
        sampling = f"_q{self.client_fraction:g}-{self.client_sampling}" if self.sampled else ""
        audit = f"_audit{self.audit_canaries}" if self.audit_canaries else ""  # own folder: not resumed as plain
        fault = f"_FAULT-{self.dp_fault}" if self.dp_fault else ""  # a broken mechanism never shares a folder
        return (f"{self.framework}_{self.condition}{sampling}_N{self.num_clients}_T{self.num_rounds}_{self.dataset}"
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
    if cfg.sampled:
        check_sampling(cfg)
    if cfg.dp:
        check_accountant(cfg)
    return cfg


def check_sampling(cfg: DflDpConfig) -> None:
    """Refuse (ConfigError, naming the keys) a client-sampling setting the run cannot carry out or account for."""
    from privacy.sampling import fixed_cohort_size

    if cfg.client_sampling == "fixed":
        population = cfg.num_clients + cfg.audit_canaries // 2
        try:
            fixed_cohort_size(cfg.client_fraction, population)
        except ValueError as exc:
            need(False, "client-fraction", f"{exc}; raise client-fraction or num-clients, got {cfg.client_fraction}")
        # The audit's formal epsilon is an add/remove one (privacy/audit); dp-accounting accounts sampling
        # without replacement under replace-one only, so a fixed-size audited run would have nothing to compare with.
        need(cfg.audit_canaries == 0, "client-sampling",
             "client-sampling='fixed' with audit-canaries > 0: the client-level audit compares with an add/remove "
             "epsilon, which dp-accounting gives for Poisson sampling only; use client-sampling='poisson' or "
             "audit-canaries=0")
    # The attacks capture fixed victims from one round's replies; a sampled round may not ask them.
    need(cfg.capture_victims == 0, "capture-victims",
         f"must be 0 with client-fraction < 1 (client-fraction {cfg.client_fraction:g}): the attacks' victims are "
         f"captured from one round's replies, and a sampled round may not ask them")


def check_accountant(cfg: DflDpConfig) -> None:
    """Refuse (ConfigError) DP settings the run's accountant cannot account for, before any work.

    The same call the ServerApp makes for the summary (``privacy.accounting.account``): a noise
    multiplier it divides by zero on (eps-cal=1e300), an epsilon that is not finite, or a sigma_abs
    that is 0 or inf in the float32 model (flower_apps/accountable.py says which values work).
    """
    from flower_apps.accountable import noise_sd_error, refuse_unaccountable
    from privacy.accounting import account, account_sampled

    def epsilon(v: dict[str, Any]) -> float:
        row = account(cfg.framework, v["clip-norm"], v["eps-cal"], v["num-clients"], v["num-rounds"],
                      v["delta-cal"], v["delta-total"])
        bad = noise_sd_error("sigma_abs", row.sigma_abs)
        if bad:
            raise ValueError(bad)
        eps = max(row.eps_total, row.eps_rdp_accountant)
        if v.get("client-fraction", 1.0) < 1:  # the sampled ledger the summary reports beside the full one
            sampled = account_sampled(cfg.framework, v["clip-norm"], v["eps-cal"],
                                      v["num-clients"] + cfg.audit_canaries // 2, v["num-rounds"], v["delta-cal"],
                                      v["delta-total"], v["client-fraction"], cfg.client_sampling)
            bad = noise_sd_error("sigma_abs", sampled.sigma_abs)
            if bad:
                raise ValueError(bad)
            eps = max(eps, sampled.eps_amplified, sampled.eps_unamplified)
        return eps

    values = {"clip-norm": cfg.clip_norm, "eps-cal": cfg.eps_cal, "delta-cal": cfg.delta_cal,
              "delta-total": cfg.delta_total, "num-clients": cfg.num_clients, "num-rounds": cfg.num_rounds}
    if cfg.sampled:
        values["client-fraction"] = cfg.client_fraction
    refuse_unaccountable(KEYS.keys, values, epsilon, "the client-level RDP accountant (privacy/accounting.py)")
