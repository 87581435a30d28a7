"""The tabular-pdp study's validated config (a frozen dataclass built once from the run config)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from datasets.cancer import COUNTRY_COUNTS
from flower_apps.config import ConfigError, check_study_fault, need
from flower_apps.tabular_pdp.study import ACTION, KEYS, POISONS, STUDY  # noqa: F401  (re-exported)

_PAPER = {"dataset": "cancer-synthetic", "num-clients": 10, "num-rounds": 5, "lr": 0.001}
PRESETS: dict[str, dict[str, Any]] = {
    # The paper: 10 clients (one per country), 5 rounds of 100 local epochs, Adam lr 1e-3.
    "paper": {**_PAPER, "local-epochs": 100},
    # Seconds on a laptop: for tests and a first look (2 rounds of 2 epochs).
    "smoke": {**_PAPER, "num-rounds": 2, "local-epochs": 2},
    # The reduced sweep's per-run settings: the paper's 5 rounds with 10 local epochs.
    "reduced": {**_PAPER, "local-epochs": 10},
}


if TYPE_CHECKING:  # the fields KEYS.config_class derives, written out for the type checker
    from flower_apps.tabular_pdp.config_fields import TabularPdpConfigFields as _Fields
else:
    _Fields = object


class _TabularPdpRun(_Fields):
    """What a tabular-pdp run derives from its fields (one field per key of KEYS, flower_apps/tabular_pdp/study.py)."""

    @property
    def default_run_name(self) -> str:
        settings = "-".join(self.settings) or "detect"
        poison = "" if self.poison == "none" else f"_{self.poison}{self.poison_client}"
        clip = f"_C{self.clip_norm:g}" if self.clip_mode == "fixed" else ""
        audit = f"_audit{self.audit_canaries}" if self.audit_canaries else ""  # own folder: not resumed as plain
        fault = f"_FAULT-{self.dp_fault}" if self.dp_fault else ""  # a broken mechanism never shares a folder
        return (f"{settings}{poison}{clip}_E{self.local_epochs}_T{self.num_rounds}_{self.dataset}_s{self.seed}"
                f"{audit}{fault}")


if TYPE_CHECKING:
    TabularPdpConfig = _TabularPdpRun
else:
    TabularPdpConfig = KEYS.config_class("TabularPdpConfig", base=_TabularPdpRun,
                                         doc="Everything one tabular-pdp run needs (a field per key); built by "
                                             "build_config.")


def build_config(c: dict[str, Any]) -> TabularPdpConfig:
    """Validate the flat run config (kebab-case keys) and build the dataclass."""
    cfg = KEYS.build(TabularPdpConfig, c)  # every single-key check (flower_apps/tabular_pdp/study.py)
    need(cfg.dataset != "cancer-csv" or bool(cfg.data_dir), "data-dir",
         "dataset 'cancer-csv' needs data-dir = the CSV file or its folder")
    if cfg.dataset == "cancer-synthetic":
        need(cfg.num_clients <= len(COUNTRY_COUNTS), "num-clients",
             f"one client per Country_Region: at most {len(COUNTRY_COUNTS)}, got {cfg.num_clients}")
    need(cfg.clip_mode != "estimate" or not cfg.settings or cfg.num_clients >= 3, "tab-clip-mode",
         f"'estimate' takes an order statistic that no single client controls (privacy/clip_estimate.py) "
         f"and needs num-clients >= 3, got {cfg.num_clients}; use tab-clip-mode='fixed' with tab-clip-norm")
    check_study_fault(cfg.dp_fault, STUDY, bool({"gdp", "pdp"} & set(cfg.settings)))
    need(cfg.poison_client < cfg.num_clients, "tab-poison-client",
         f"must be a client id in 0..{cfg.num_clients - 1}, got {cfg.poison_client}")
    need(cfg.audit_canaries % 2 == 0 and cfg.audit_canaries != 2, "tab-audit-canaries",
         f"must be 0 or an even number >= 4 per client (half inserted, half held out), got {cfg.audit_canaries}")
    need(cfg.audit_canaries == 0 or bool({"gdp", "pdp"} & set(cfg.settings)), "tab-audit-canaries",
         "an audit measures GDP or PDP: tab-settings must include gdp or pdp")
    if {"gdp", "pdp"} & set(cfg.settings) and cfg.noise_multiplier > 0:  # 0: no noise, warned by the ServerApp
        check_accountant(cfg)
    return cfg


def nodes_needed(cfg: TabularPdpConfig) -> int:
    """One SuperNode per hospital (each client is one message)."""
    return cfg.num_clients


def check_accountant(cfg: TabularPdpConfig) -> None:
    """Refuse (ConfigError) GDP/PDP settings the per-client ledger cannot account for, before any work.

    The ledger's own function (``privacy.tabular_accounting.gaussian_epsilon``) at the release's
    noise multiplier for equal client weights (n_eps) and for the heaviest possible client
    (n_eps / num-clients: the largest epsilon any client can get); with a fixed clip norm, also the
    GDP noise SD n_eps C / m for m = 1 and num-clients, which must be > 0 and finite in float32.
    """
    from flower_apps.accountable import noise_sd_error, refuse_unaccountable
    from privacy.personalized import gdp_sigma
    from privacy.tabular_accounting import gaussian_epsilon

    def epsilon(v: dict[str, Any]) -> float:
        n_eps, m = v["tab-noise-multiplier"], v["num-clients"]
        if cfg.clip_mode == "fixed":
            for cohort in (1, m):
                bad = noise_sd_error("the GDP noise SD n_eps C / m", gdp_sigma(n_eps, v["tab-clip-norm"], cohort))
                if bad:
                    raise ValueError(bad)
        # typed in privacy/tabular_accounting.py: its dict says float | None, eps_rdp is always a float
        return max(cast(float, gaussian_epsilon(z, v["num-rounds"], v["delta-total"])["eps_rdp"])
                   for z in (n_eps, n_eps / m))

    values = {"tab-noise-multiplier": cfg.noise_multiplier, "num-rounds": cfg.num_rounds,
              "delta-total": cfg.delta, "num-clients": cfg.num_clients}
    if cfg.clip_mode == "fixed":
        values["tab-clip-norm"] = cfg.clip_norm
    refuse_unaccountable(KEYS.keys, values, epsilon, "the GDP/PDP ledger (privacy/tabular_accounting.py)")


def config_for(preset: str = "smoke", **overrides: Any) -> TabularPdpConfig:
    """A validated config from the study's keys, a preset and kebab-case overrides (tests, notebooks).

    Unlike the router, a value given here wins even when it equals the default.
    """
    if preset not in PRESETS:
        raise ConfigError(f"preset={preset!r} is not a preset of study {STUDY!r}; allowed: {sorted(PRESETS)}")
    unknown = sorted(set(overrides) - set(KEYS.keys))
    if unknown:
        raise ConfigError(f"unknown run-config key(s) {unknown}")
    return build_config({**KEYS.defaults(), **PRESETS[preset], "study": STUDY, "preset": preset, **overrides})
