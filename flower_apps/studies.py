"""The study registry: study name -> StudySpec.

A study is a package ``flower_apps/<pkg>/`` with:

* ``study.py``: ``STUDY`` (its name), ``ACTION`` (its ClientApp action) and ``KEYS`` (a
  :class:`flower_apps.config.KeyTable`: the one declaration of each run key it adds);
  it imports nothing else of its package, so ``config.py`` can read the keys without a cycle;
* ``config.py``: ``PRESETS`` and ``build_config`` (the cross-field rules and the frozen dataclass);
* ``server_app.py``: ``server_main``; ``client_app.py``: ``train`` (the ``train.<action>`` handler) and,
  where the study sends them, ``evaluate`` (``evaluate.<action>``) and ``query`` (``query.<action>``);
* optional: ``nodes_needed(cfg)`` in ``config.py`` (the SuperNodes a run needs; default
  ``ceil(num_clients / clients_per_message)``) and ``card.py`` with ``CARD`` (its report card,
  :class:`flower_apps.common.report_card.CardSpec`; ``python -m flower_apps.report`` lists it).

The packages listed in ``BUILTIN`` are registered at import when present.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Iterator
from typing import Any

from flower_apps.common.doc_blocks import BLOCKS as DOC_BLOCKS
from flower_apps.common.doc_blocks import VALUES as DOC_VALUES
from flower_apps.config import COMMON_KEYS, DECLARED, RUN_CONFIG_DEFAULTS, StudySpec

BUILTIN = ("dfl_dp", "tabular_pdp", "ultrasound", "unlinkable_dfl")
STUDIES: dict[str, StudySpec] = {}
BUILTIN_STUDIES: list[str] = []  # names of the studies registered from BUILTIN (this repository's own)


def register_study(spec: StudySpec) -> None:
    """Add a study and its run keys; duplicate names/actions and conflicting key declarations are refused."""
    if spec.name in STUDIES:
        raise ValueError(f"study {spec.name!r} is already registered")
    if any(s.action == spec.action for s in STUDIES.values()):
        raise ValueError(f"ClientApp action {spec.action!r} is already used")
    for key in spec.keys.own:
        if key.name in COMMON_KEYS:  # a KeyTable refuses this already; a hand-made spec may not
            raise ValueError(f"study {spec.name!r} redefines the common key {key.name!r}; set it in a preset instead")
        prior = DECLARED.get(key.name)
        if prior is None:
            continue
        if prior.default != key.default:
            raise ValueError(f"study {spec.name!r}: key {key.name!r} default {key.default!r} conflicts with "
                             f"{prior.default!r} of another study")
        if prior.declaration() != key.declaration():
            raise ValueError(f"study {spec.name!r}: key {key.name!r} is declared again with another type or doc; "
                             "declare it once (flower_apps.config.SHARED_KEYS) and list it in both studies")
    if spec.card is not None and getattr(spec.card, "study", spec.name) != spec.name:
        raise ValueError(f"study {spec.name!r} registers the report card of {spec.card.study!r}")
    clash = sorted((set(spec.doc_blocks) & set(DOC_BLOCKS)) | (set(spec.doc_values) & set(DOC_VALUES)))
    if clash:
        raise ValueError(f"study {spec.name!r}: doc blocks / value namespaces {clash} are already registered")
    for name, fn in spec.doc_blocks.items():
        DOC_BLOCKS.register(name, fn)
    for name, fn in spec.doc_values.items():
        DOC_VALUES.register(name, fn)
    DECLARED.update({k.name: k for k in spec.keys.own})
    RUN_CONFIG_DEFAULTS.update({k.name: k.default for k in spec.keys.own})
    STUDIES[spec.name] = spec


@contextlib.contextmanager
def registered(spec: StudySpec) -> Iterator[StudySpec]:
    """Register ``spec`` for the duration (tests, notebooks): the registries are process-wide, and this
    restores them, keys included, on exit."""
    live_maps: tuple[dict[str, Any], ...] = (STUDIES, DECLARED, RUN_CONFIG_DEFAULTS, DOC_BLOCKS, DOC_VALUES)
    saved = tuple(dict(m) for m in live_maps)
    register_study(spec)
    try:
        yield spec
    finally:
        for live, old in zip(live_maps, saved):
            live.clear()
            live.update(old)


def load_study(pkg: str) -> StudySpec:
    """The spec of the study package ``flower_apps.<pkg>`` (see the module docstring)."""
    study = importlib.import_module(f"flower_apps.{pkg}.study")
    config = importlib.import_module(f"flower_apps.{pkg}.config")
    server_app = importlib.import_module(f"flower_apps.{pkg}.server_app")
    client_app = importlib.import_module(f"flower_apps.{pkg}.client_app")
    card = (importlib.import_module(f"flower_apps.{pkg}.card").CARD
            if importlib.util.find_spec(f"flower_apps.{pkg}.card") is not None else None)
    docs = (importlib.import_module(f"flower_apps.{pkg}.docs")
            if importlib.util.find_spec(f"flower_apps.{pkg}.docs") is not None else None)
    return StudySpec(study.STUDY, study.ACTION, study.KEYS, config.PRESETS, config.build_config,
                     server_app.server_main, client_app.train, nodes=getattr(config, "nodes_needed", None), card=card,
                     client_evaluate=_handler(client_app, "evaluate"), client_query=_handler(client_app, "query"),
                     doc_blocks=getattr(docs, "BLOCKS", {}), doc_values=getattr(docs, "VALUES", {}))


def _handler(module: Any, kind: str) -> Any:
    """``module.<kind>`` (the ``evaluate`` / ``query`` handler) when the module defines one, else None.

    A function of that name imported from elsewhere is refused, not registered: it would answer
    ``<kind>.<action>`` messages without being a handler (import it under another name).
    """
    fn = getattr(module, kind, None)
    if fn is not None and getattr(fn, "__module__", None) != module.__name__:
        raise TypeError(f"{module.__name__}.{kind} is {fn.__module__}.{kind}, not a {kind} handler defined there; "
                        f"import it under another name")
    return fn


def _register_builtin() -> None:
    for pkg in BUILTIN:
        if importlib.util.find_spec(f"flower_apps.{pkg}") is None or \
                importlib.util.find_spec(f"flower_apps.{pkg}.study") is None:
            continue
        spec = load_study(pkg)
        register_study(spec)
        BUILTIN_STUDIES.append(spec.name)


_register_builtin()
