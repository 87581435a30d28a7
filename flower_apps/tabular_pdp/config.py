"""The tabular-pdp study's validated config (a frozen dataclass built once from the run config)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from datasets.cancer import COUNTRY_COUNTS, SOURCES
from flower_apps.config import ConfigError
from privacy.anonymization import HIERARCHY_DEPTH, QUASI_IDENTIFIERS, HierarchyLevelError, validate_levels

STUDY = "tabular-pdp"
ACTION = "tabular_pdp"
SETTINGS = ("vanilla", "gdp", "pdp")
CLIP_MODES = ("estimate", "fixed")
POISONS = ("none", "shift-targets", "flip-targets", "scale-features")
# Model inputs the table offers (targets, identifiers and the client's region excluded). The paper
# speaks of 8 features without listing them; Treatment_Cost_USD and Survival_Years are outcomes,
# not risk factors, and are left out by default (Treatment_Cost_USD would make the target almost
# deterministic, see datasets.cancer). A QI generalized to a single value ("*") is dropped.
FEATURE_CHOICES = ("Age", "Gender", "Year", "Genetic_Risk", "Air_Pollution", "Alcohol_Use", "Smoking",
                   "Obesity_Level", "Cancer_Type", "Cancer_Stage", "Treatment_Cost_USD", "Survival_Years")
DEFAULT_FEATURES = FEATURE_CHOICES[:10]

_PAPER = {"dataset": "cancer-synthetic", "num-clients": 10, "num-rounds": 5, "lr": 0.001}
PRESETS: dict[str, dict[str, Any]] = {
    # The paper: 10 clients (one per country), 5 rounds of 100 local epochs, Adam lr 1e-3.
    "paper": {**_PAPER, "local-epochs": 100},
    # Seconds on a laptop: for tests and a first look (2 rounds of 2 epochs).
    "smoke": {**_PAPER, "num-rounds": 2, "local-epochs": 2},
    # The reduced sweep's per-run settings: the paper's 5 rounds with 10 local epochs.
    "reduced": {**_PAPER, "local-epochs": 10},
}


@dataclass(frozen=True)
class TabularPdpConfig:
    """Everything one tabular-pdp run needs; built by :func:`build_config`."""

    seed: int
    num_clients: int
    num_rounds: int
    dataset: str
    data_dir: str
    data_fraction: float
    test_fraction: float
    local_epochs: int
    lr: float
    batch_size: int
    k: int
    suppression: float
    levels: tuple[int, ...] | None
    sa_bin_width: float
    features: tuple[str, ...]
    settings: tuple[str, ...]
    noise_multiplier: float
    clip_mode: str
    clip_norm: float
    clip_quantile: float
    delta: float
    drift_threshold: float
    drift_min_ratio: float
    drift_recheck: int
    drift_exclude: bool
    poison: str
    poison_client: int
    poison_scale: float
    device: str
    results_dir: str
    run_name: str
    preset: str
    noise_seed_file: str = ""  # "" = secure DP noise; else a local seed file (privacy.randomness)

    def to_json(self) -> str:
        """Serialized form carried in every message."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TabularPdpConfig":
        """Inverse of :meth:`to_json`."""
        d = json.loads(text)
        d["levels"] = None if d["levels"] is None else tuple(d["levels"])
        d["features"], d["settings"] = tuple(d["features"]), tuple(d["settings"])
        return cls(**d)

    @property
    def default_run_name(self) -> str:
        settings = "-".join(self.settings) or "detect"
        poison = "" if self.poison == "none" else f"_{self.poison}{self.poison_client}"
        clip = f"_C{self.clip_norm:g}" if self.clip_mode == "fixed" else ""
        return f"{settings}{poison}{clip}_E{self.local_epochs}_T{self.num_rounds}_{self.dataset}_s{self.seed}"


def _need(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def _int(c: dict, key: str, lo: int) -> int:
    v = c[key]
    _need(isinstance(v, int) and not isinstance(v, bool) and v >= lo, key, f"must be an integer >= {lo}, got {v!r}")
    return int(v)


def _list(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in str(text).split(",") if s.strip())


def _levels(text: str) -> tuple[int, ...] | None:
    if not str(text).strip():
        return None
    allowed = ", ".join(f"{q} 0..{HIERARCHY_DEPTH[q]}" for q in QUASI_IDENTIFIERS)
    try:
        vals = [int(s) for s in _list(text)]
        return validate_levels(vals)
    except (ValueError, HierarchyLevelError) as exc:
        raise ConfigError(f"tab-levels: {exc}; expected '' (search per client) or one level per "
                          f"quasi-identifier {list(QUASI_IDENTIFIERS)}: {allowed}") from None


def build_config(c: dict[str, Any]) -> TabularPdpConfig:
    """Validate the flat run config (kebab-case keys) and build the dataclass."""
    _need(c["dataset"] in SOURCES, "dataset", f"got {c['dataset']!r}; allowed: {list(SOURCES)}")
    _need(c["dataset"] != "cancer-csv" or bool(c["data-dir"]), "data-dir",
          "dataset 'cancer-csv' needs data-dir = the CSV file or its folder")
    n = _int(c, "num-clients", 2)
    if c["dataset"] == "cancer-synthetic":
        _need(n <= len(COUNTRY_COUNTS), "num-clients",
              f"one client per Country_Region: at most {len(COUNTRY_COUNTS)}, got {n}")
    seed = _int(c, "seed", 0)
    rounds = _int(c, "num-rounds", 1)
    _need(0 < c["data-fraction"] <= 1, "data-fraction", f"must be in (0, 1], got {c['data-fraction']}")
    _need(0 < c["test-fraction"] < 1, "test-fraction", f"must be in (0, 1), got {c['test-fraction']}")
    epochs = _int(c, "local-epochs", 1)
    _need(c["lr"] > 0, "lr", f"must be > 0, got {c['lr']}")
    batch = _int(c, "batch-size", 1)
    k = _int(c, "tab-k", 1)
    _need(0 <= c["tab-suppression"] <= 1, "tab-suppression",
          f"must be a fraction in [0, 1], got {c['tab-suppression']}")
    levels = _levels(c["tab-levels"])
    _need(c["tab-sa-bin-width"] >= 0, "tab-sa-bin-width", f"must be >= 0 (0 = raw score), got {c['tab-sa-bin-width']}")
    features = _list(c["tab-features"])
    bad = [f for f in features if f not in FEATURE_CHOICES]
    _need(bool(features) and not bad, "tab-features", f"unknown or empty {bad or features}; allowed: "
          f"comma-separated subset of {list(FEATURE_CHOICES)}")
    _need(len(set(features)) == len(features), "tab-features", f"duplicates in {list(features)}")
    settings = _list(c["tab-settings"])
    bad = [s for s in settings if s not in SETTINGS]
    _need(not bad and len(set(settings)) == len(settings), "tab-settings",
          f"got {c['tab-settings']!r}; allowed: comma-separated subset of {list(SETTINGS)} ('' = detection only)")
    _need(c["tab-noise-multiplier"] >= 0, "tab-noise-multiplier", f"must be >= 0, got {c['tab-noise-multiplier']}")
    _need(c["tab-clip-mode"] in CLIP_MODES, "tab-clip-mode", f"got {c['tab-clip-mode']!r}; allowed: {list(CLIP_MODES)}")
    _need(c["tab-clip-norm"] > 0, "tab-clip-norm", f"must be > 0, got {c['tab-clip-norm']}")
    _need(0 < c["tab-clip-quantile"] <= 1, "tab-clip-quantile", f"must be in (0, 1], got {c['tab-clip-quantile']}")
    _need(0 < c["delta-total"] < 1, "delta-total", f"must be in (0, 1), got {c['delta-total']}")
    _need(c["tab-drift-threshold"] > 0, "tab-drift-threshold", f"must be > 0, got {c['tab-drift-threshold']}")
    _need(c["tab-drift-min-ratio"] >= 1, "tab-drift-min-ratio", f"must be >= 1, got {c['tab-drift-min-ratio']}")
    recheck = _int(c, "tab-drift-recheck", 0)
    _need(isinstance(c["tab-drift-exclude"], bool), "tab-drift-exclude",
          f"must be true or false, got {c['tab-drift-exclude']!r}")
    _need(c["tab-poison"] in POISONS, "tab-poison", f"got {c['tab-poison']!r}; allowed: {list(POISONS)}")
    pc = _int(c, "tab-poison-client", 0)
    _need(pc < n, "tab-poison-client", f"must be a client id in 0..{n - 1}, got {pc}")
    _need(c["tab-poison-scale"] > 0, "tab-poison-scale", f"must be > 0, got {c['tab-poison-scale']}")
    _need(c["device"] in ("auto", "cpu") or str(c["device"]).startswith("cuda"), "device",
          f"got {c['device']!r}; allowed: 'auto', 'cpu', 'cuda', 'cuda:<i>'")
    return TabularPdpConfig(
        seed=seed, num_clients=n, num_rounds=rounds, dataset=c["dataset"], data_dir=c["data-dir"],
        data_fraction=float(c["data-fraction"]), test_fraction=float(c["test-fraction"]), local_epochs=epochs,
        lr=float(c["lr"]), batch_size=batch, k=k, suppression=float(c["tab-suppression"]), levels=levels,
        sa_bin_width=float(c["tab-sa-bin-width"]), features=features, settings=settings,
        noise_multiplier=float(c["tab-noise-multiplier"]), clip_mode=c["tab-clip-mode"],
        clip_norm=float(c["tab-clip-norm"]), clip_quantile=float(c["tab-clip-quantile"]),
        delta=float(c["delta-total"]), drift_threshold=float(c["tab-drift-threshold"]),
        drift_min_ratio=float(c["tab-drift-min-ratio"]), drift_recheck=recheck,
        drift_exclude=bool(c["tab-drift-exclude"]), poison=c["tab-poison"], poison_client=pc,
        poison_scale=float(c["tab-poison-scale"]), device=c["device"], results_dir=c["results-dir"],
        run_name=c["run-name"], preset=c["preset"], noise_seed_file=str(c["noise-seed-file"]),
    )


def config_for(preset: str = "smoke", **overrides: Any) -> TabularPdpConfig:
    """A validated config from the study's keys, a preset and kebab-case overrides (tests, notebooks).

    Unlike the router, a value given here wins even when it equals the default.
    """
    from flower_apps.config import COMMON_KEYS
    from flower_apps.tabular_pdp.study import KEYS

    if preset not in PRESETS:
        raise ConfigError(f"preset={preset!r} is not a preset of study {STUDY!r}; allowed: {sorted(PRESETS)}")
    unknown = sorted(set(overrides) - set(COMMON_KEYS) - set(KEYS))
    if unknown:
        raise ConfigError(f"unknown run-config key(s) {unknown}")
    return build_config({**COMMON_KEYS, **KEYS, **PRESETS[preset], "study": STUDY, "preset": preset, **overrides})
