"""Run-config resolution: defaults < preset < explicit values, validated before any work.

``[tool.flwr.app.config]`` in pyproject.toml holds every run key with its default
(``RUN_CONFIG_DEFAULTS`` below mirrors it; tests/test_config.py checks they agree).
Flower hands the ServerApp the *fused* config (defaults with the user's overrides), so a
preset applies to the keys still at their default: ``preset='smoke' num-rounds=5`` gives
the smoke preset with 5 rounds. To force a key back to its default value under a preset,
drop the preset and give the keys explicitly.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Keys every study reads. Each study adds its own in ``flower_apps/<study>/study.py`` (KEYS);
# flower_apps.studies merges them into RUN_CONFIG_DEFAULTS and refuses conflicting defaults.
COMMON_KEYS: dict[str, Any] = {
    "study": "dfl-dp",
    "preset": "paper",
    "seed": 0,
    "results-dir": "results",
    "run-name": "",
    "dataset": "mnist",
    "data-dir": "",
    "data-fraction": 1.0,
    "num-clients": 100,
    "num-rounds": 100,
    "device": "auto",
    # Seconds the ServerApp waits for one round's (or one chain hop's) replies before treating the
    # missing ones as failed. Dead SuperNodes surface sooner (NODE_UNAVAILABLE after their heartbeat
    # lapses, <= 60 s in flwr 1.42); this bounds the wait for nodes that stay online but hang.
    "round-timeout": 3600.0,
    # DP noise randomness: "" = secure (OS entropy, reproducible by nobody); a path = a LOCAL file
    # whose content seeds the noise of the party that reads it (research opt-in; only the path
    # travels in messages). See privacy/randomness.py.
    "noise-seed-file": "",
}
RUN_CONFIG_DEFAULTS: dict[str, Any] = dict(COMMON_KEYS)


class ConfigError(ValueError):
    """A run config that cannot run; the message names the key and the allowed values."""


def pyproject_defaults(path: str | Path | None = None) -> dict[str, Any]:
    """``[tool.flwr.app.config]`` of the project's pyproject.toml."""
    path = Path(path) if path else Path(__file__).resolve().parents[1] / "pyproject.toml"
    with open(path, "rb") as fh:
        return tomllib.load(fh)["tool"]["flwr"]["app"]["config"]


@dataclass(frozen=True)
class StudySpec:
    """What the router needs to know about a study."""

    name: str
    action: str  # ClientApp action: messages are of type "train.<action>"
    presets: dict[str, dict[str, Any]]
    build_config: Any  # Callable[[dict], frozen dataclass], raises ConfigError
    server_main: Any  # Callable[[Grid, config], dict]  (returns the run summary)
    client_train: Any  # Callable[[Message, Context], Message]


def resolve(raw: dict[str, Any], studies: dict[str, StudySpec]) -> tuple[StudySpec, dict[str, Any]]:
    """Validate keys, apply the study's preset, and return (spec, flat resolved config)."""
    check_keys(raw)
    study = raw.get("study", RUN_CONFIG_DEFAULTS["study"])
    if study not in studies:
        raise ConfigError(f"study={study!r} is not a study; allowed: {sorted(studies)}")
    spec = studies[study]
    preset = raw.get("preset", RUN_CONFIG_DEFAULTS["preset"])
    if preset not in spec.presets:
        raise ConfigError(f"preset={preset!r} is not a preset of study {study!r}; allowed: {sorted(spec.presets)}")
    explicit = {k: v for k, v in raw.items() if v != RUN_CONFIG_DEFAULTS[k]}
    for key, val in explicit.items():
        default = RUN_CONFIG_DEFAULTS[key]
        if isinstance(default, bool) and not isinstance(val, bool):
            raise ConfigError(f"{key} must be true or false, got {val!r}")
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            if isinstance(val, bool) or not isinstance(val, (int, float)):
                raise ConfigError(f"{key} must be a number, got {val!r}")
        if isinstance(default, str) and not isinstance(val, str):
            raise ConfigError(f"{key} must be a string, got {val!r}")
    resolved = {**RUN_CONFIG_DEFAULTS, **spec.presets[preset], **explicit}
    check_finite(resolved)
    check_common(resolved)
    return spec, resolved


def check_common(c: dict[str, Any]) -> None:
    """Ranges of the keys every study shares (each study checks its own keys in build_config)."""
    from privacy.randomness import NoiseSource

    for key, lo in (("seed", 0), ("num-rounds", 1), ("num-clients", 1)):
        if not (isinstance(c[key], int) and not isinstance(c[key], bool) and c[key] >= lo):
            raise ConfigError(f"{key} must be an integer >= {lo}, got {c[key]!r}")
    if not c["round-timeout"] > 0:
        raise ConfigError(f"round-timeout must be > 0 seconds, got {c['round-timeout']!r}")
    if not 0 < c["data-fraction"] <= 1:
        raise ConfigError(f"data-fraction must be in (0, 1], got {c['data-fraction']!r}")
    try:
        NoiseSource(c["noise-seed-file"]).check()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"noise-seed-file: {exc}") from None


def check_keys(raw: dict[str, Any]) -> None:
    """Refuse unknown keys, naming the nearest valid key for each."""
    unknown = sorted(set(raw) - set(RUN_CONFIG_DEFAULTS))
    if not unknown:
        return
    hints = []
    for key in unknown:
        near = difflib.get_close_matches(key, list(RUN_CONFIG_DEFAULTS), n=1, cutoff=0.6)
        hints.append(f"{key!r} (did you mean {near[0]!r}?)" if near else repr(key))
    raise ConfigError(f"unknown run-config key(s) {', '.join(hints)}; the {len(RUN_CONFIG_DEFAULTS)} valid keys "
                      "are listed under [tool.flwr.app.config] in pyproject.toml")


def check_finite(config: dict[str, Any]) -> None:
    """Every numeric value must be a finite number (inf or nan would silently disable DP)."""
    for key, val in config.items():
        if isinstance(val, float) and not math.isfinite(val):
            raise ConfigError(f"{key} must be a finite number, got {val!r}")
