"""The study registry: study name -> StudySpec.

A study is a package ``flower_apps/<pkg>/`` with a module ``study.py`` defining ``SPEC``
(a :class:`flower_apps.config.StudySpec`) and ``KEYS`` (its run keys with defaults). The
packages listed in ``BUILTIN`` are registered at import when present.
"""

from __future__ import annotations

import importlib
import importlib.util

from flower_apps.config import COMMON_KEYS, RUN_CONFIG_DEFAULTS, StudySpec

BUILTIN = ("dfl_dp", "tabular_pdp", "ultrasound", "unlinkable_dfl")
STUDIES: dict[str, StudySpec] = {}


def register_study(spec: StudySpec, keys: dict) -> None:
    """Add a study and its run keys; duplicate names/actions and conflicting key defaults are refused."""
    if spec.name in STUDIES:
        raise ValueError(f"study {spec.name!r} is already registered")
    if any(s.action == spec.action for s in STUDIES.values()):
        raise ValueError(f"ClientApp action {spec.action!r} is already used")
    for key, default in keys.items():
        if key in COMMON_KEYS:
            raise ValueError(f"study {spec.name!r} redefines the common key {key!r}; set it in a preset instead")
        if key in RUN_CONFIG_DEFAULTS and RUN_CONFIG_DEFAULTS[key] != default:
            raise ValueError(f"study {spec.name!r}: key {key!r} default {default!r} conflicts with "
                             f"{RUN_CONFIG_DEFAULTS[key]!r} of another study")
    RUN_CONFIG_DEFAULTS.update(keys)
    STUDIES[spec.name] = spec


def _register_builtin() -> None:
    for pkg in BUILTIN:
        name = f"flower_apps.{pkg}.study"
        if importlib.util.find_spec(f"flower_apps.{pkg}") is None or importlib.util.find_spec(name) is None:
            continue
        mod = importlib.import_module(name)
        register_study(mod.SPEC, mod.KEYS)


_register_builtin()
