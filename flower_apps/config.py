"""Run keys and run-config resolution: defaults < preset < explicit values, validated before any work.

Every run key is declared once, as a :class:`Key` (name, default, type, range or choices, one-line
doc): the keys every study reads in ``COMMON`` below, the keys several studies read in
``SHARED_KEYS``, and each study's own keys in ``flower_apps/<study>/study.py`` (``KEYS``, a
:class:`KeyTable` that lists the common keys the study narrows and the shared keys it reads).
Everything else derives from those declarations: the simple checks (type, finite, range, choices),
the conversion into each study's frozen config dataclass, ``[tool.flwr.app.config]`` in
pyproject.toml and docs/run_keys.md (both written by ``scripts/sync_run_keys.py``, see
:mod:`flower_apps.keys`). A study's ``build_config`` adds only its cross-field rules.

Flower hands the ServerApp the *fused* config (defaults with the user's overrides), so a preset
applies to the keys still at their default: ``preset='smoke' num-rounds=5`` gives the smoke preset
with 5 rounds. To force a key back to its default value under a preset, drop the preset and give
the keys explicitly.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import sys
import tomllib
from collections.abc import Callable, Collection, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

from flower_apps.errors import ConfigError  # re-exported: flower_apps.config.ConfigError, as always

_C = TypeVar("_C")


def need(cond: bool, key: str, msg: str) -> None:
    """Raise ``ConfigError('<key>: <msg>')`` unless ``cond`` (a study's cross-field rules)."""
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def check_study_fault(fault: str, study: str, has_dp: bool) -> None:
    """ConfigError unless ``fault`` is '' or one of ``study``'s faults (privacy/faults.py) in a run with DP."""
    if not fault:
        return
    from privacy.faults import FAULTS_BY_STUDY

    need(fault in FAULTS_BY_STUDY.get(study, ()), "dp-fault",
         f"{fault!r} is not a fault of study {study!r}; its faults: {list(FAULTS_BY_STUDY.get(study, ()))}")
    need(has_dp, "dp-fault", "a fault breaks a DP mechanism: the run needs DP")


def _num(x: float) -> str:
    return f"{x:g}"


def toml_text(value: Any) -> str:
    """A value as the user writes it in ``--run-config`` (``''``, ``'busi'``, ``2``, ``true``)."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)


@dataclass(frozen=True)
class Key:
    """One run key: the one declaration its default, checks, pyproject line and docs row derive from.

    ``gt``/``ge``/``lt``/``le`` bound a number; ``choices`` lists the allowed strings (a tuple keeps
    its order in messages, a registry dict is read live and shown sorted); ``many``: the value is a
    comma-separated subset of ``choices`` (no duplicates, at least ``min_items``); ``pattern``: the
    whole value must match it, ``allowed`` says so in words; ``parse``: a further check and
    conversion of the value (raises ValueError saying what is wrong). ``field`` names the config
    dataclass field the key fills ("" = the name in snake_case). ``unused_when`` maps another key
    to the values under which this key is not read (``{"dataset": ("mnist-5k",)}``): a value other
    than the default is then refused rather than silently ignored. ``held`` false: the study's config
    dataclass has no field for the key (a common key the study never reads; its value is still checked).

    What the key says about a run besides its value: ``roles`` (names from :data:`ROLES`: every list
    of keys the platform needs, what a seeded noise stream ignores, what the report card groups over,
    what ``deploy.export`` writes, is the keys of a role), and its part in the run's identity
    (:func:`flower_apps.common.results.run_identity`): ``in_run_hash`` false keeps it out;
    ``hash_omit_when`` leaves it out while any named key (itself included) holds one of the listed
    values (keys added after runs were kept: those runs keep their hash); ``hash_null_when`` hashes it
    as null while any named key holds one of the listed values (a knob the run does not read).
    """

    name: str
    default: Any
    type: type
    _: KW_ONLY
    doc: str
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    unit: str = ""
    choices: Collection[str] | None = None
    many: bool = False
    min_items: int = 0
    pattern: str | None = None
    allowed: str = ""
    parse: Callable[[Any], Any] | None = None
    field: str = ""
    unused_when: Mapping[str, Collection[Any]] | None = None
    held: bool = True
    roles: AbstractSet[str] = frozenset()  # a frozenset after __post_init__
    in_run_hash: bool = True
    hash_omit_when: Mapping[str, Collection[Any]] | None = None
    hash_null_when: Mapping[str, Collection[Any]] | None = None

    def __post_init__(self) -> None:
        if self.type not in (bool, int, float, str):
            raise TypeError(f"key {self.name}: type must be bool, int, float or str, got {self.type!r}")
        if not self.doc or "\n" in self.doc:
            raise ValueError(f"key {self.name}: doc must be one line")
        if not self.field:
            object.__setattr__(self, "field", self.name.replace("-", "_"))
        object.__setattr__(self, "roles", frozenset(self.roles))
        unknown = sorted(self.roles - set(ROLES))
        if unknown:
            raise ValueError(f"key {self.name}: unknown roles {unknown}; allowed: {sorted(ROLES)}")

    def conditions(self) -> dict[str, Mapping[str, Collection[Any]]]:
        """The key's conditions on other keys (``unused_when``, ``hash_omit_when``, ``hash_null_when``)."""
        named = {"unused_when": self.unused_when, "hash_omit_when": self.hash_omit_when,
                 "hash_null_when": self.hash_null_when}
        return {k: v for k, v in named.items() if v}

    def default_value(self) -> Any:
        """The default as the config dataclass holds it (checked and converted: a tuple for ``many``)."""
        return self.check(self.default)

    # --- derived text -----------------------------------------------------------------------

    def shown_choices(self) -> list[str]:
        """The allowed values as messages list them."""
        assert self.choices is not None
        return list(self.choices) if isinstance(self.choices, (tuple, list)) else sorted(self.choices)

    def bounds(self) -> str:
        """'> 0', 'in (0, 1]', 'an integer >= 2', ... ('' when unbounded and not an integer)."""
        lo = f"({_num(self.gt)}" if self.gt is not None else f"[{_num(self.ge)}" if self.ge is not None else None
        hi = f"{_num(self.lt)})" if self.lt is not None else f"{_num(self.le)}]" if self.le is not None else None
        if lo and hi:
            text = f"in {lo}, {hi}"
        elif lo:
            text = ("> " if lo[0] == "(" else ">= ") + lo[1:]
        elif hi:
            text = ("< " if hi[-1] == ")" else "<= ") + hi[:-1]
        else:
            text = ""
        if self.type is int:
            text = f"an integer {text}".strip()
        return f"{text} {self.unit}".strip() if text else ""

    def allowed_text(self) -> str:
        """The allowed values in words, as the docs and pyproject show them."""
        if self.choices is not None:
            subset = "comma-separated subset of " if self.many else "one of "
            return subset + ", ".join(self.shown_choices())
        text = self.allowed or self.bounds()
        for other, values in (self.unused_when or {}).items():
            unused = f"only {toml_text(self.default)} with {other} {', '.join(map(str, values))} (not read)"
            text = f"{text}; {unused}" if text else unused
        return text

    def declaration(self) -> tuple:
        """What must agree wherever the key appears: name, default, type, doc."""
        return self.name, self.default, self.type, self.doc

    def refine(self, **changes: Any) -> Key:
        """This key with a study's narrower range/choices or another config field (same name, default, doc)."""
        fixed = {"name", "default", "type", "doc"} & set(changes)
        if fixed:
            raise ValueError(f"key {self.name}: a refinement keeps {sorted(fixed)}; declare a new key instead")
        return dataclasses.replace(self, **changes)

    # --- checks ------------------------------------------------------------------------------

    def _range_error(self, value: Any) -> ConfigError:
        # The texts users (and tests) know: common keys read as a sentence ('seed must be ...'),
        # a study's own keys as 'tab-k: must be ...'. One place to unify them.
        sep = "" if self.name in COMMON_NAMES else ":"
        return ConfigError(f"{self.name}{sep} must be {self.bounds()}, got {value!r}")

    def check_type(self, value: Any) -> None:
        """Type, and finite for numbers (inf or nan would silently disable DP)."""
        if self.type is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{self.name} must be true or false, got {value!r}")
        elif self.type is str:
            if not isinstance(value, str):
                raise ConfigError(f"{self.name} must be a string, got {value!r}")
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{self.name} must be a number, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{self.name} must be a finite number, got {value!r}")
            if self.type is int and not isinstance(value, int):
                raise self._range_error(value)

    def check(self, value: Any) -> Any:
        """Every single-key check; returns the value converted for the config dataclass."""
        self.check_type(value)
        if self.type in (int, float) and not (
                (self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
                and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le)):
            raise self._range_error(value)
        if self.many:
            items = tuple(s.strip() for s in value.split(",") if s.strip())
            bad = [s for s in items if s not in cast(Collection[str], self.choices)]  # many keys have choices
            if bad or len(set(items)) != len(items) or len(items) < self.min_items:
                least = f", at least {self.min_items}" if self.min_items else ""
                raise ConfigError(f"{self.name}: got {value!r}; allowed: comma-separated subset of "
                                  f"{self.shown_choices()} (no duplicates{least})")
            return items
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{self.name}: got {value!r}; allowed: {self.shown_choices()}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise ConfigError(f"{self.name}: got {value!r}; allowed: {self.allowed}")
        if self.parse is not None:
            try:
                return self.parse(value)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{self.name}: {exc}") from None
        return self.type(value)


def _noise_seed_file(path: str) -> str:
    from privacy.randomness import NoiseSource

    NoiseSource(path).check()
    return path


def noise_condition(cfg: Any) -> str:
    """What a seeded noise stream mixes besides its secret (``privacy.randomness.NoiseSource``).

    The run's identity (``run_hash``) with its ``location`` keys (:data:`ROLES`: the device, the seed
    file, node-local data and the coordinator's evaluation file) at their defaults: a deployed run
    draws its simulation's noise, as do a moved seed file and another device, and two runs draw the
    same seeded noise only when they compute the same thing, never two grid points (two eps-cal) of one seed.
    """
    from flower_apps.common.results import run_hash

    table = key_table_of(cfg)
    return run_hash(dataclasses.replace(cfg, **{k.field: k.default_value() for k in table.with_role("location")
                                                if k.held}))


def _dp_fault(name: str) -> str:
    from privacy.faults import check_fault

    return check_fault(name)


def _run_name(name: str) -> str:
    """``run-name``: one folder name, so that a run writes inside ``<results-dir>/<study>/runs/`` only."""
    if name in (".", "..") or any(c in name for c in "/\\\0") or Path(name).is_absolute():
        raise ValueError(f"got {name!r}; a run name is one folder name inside <results-dir>/<study>/runs/: "
                         "no '/', '\\' or NUL, not '.' or '..' (use results-dir to write elsewhere)")
    return name


# What a run does when its folder holds a finished run of the same config (flower_apps/common/results.py).
RERUN = ("refuse", "replace")

# What a key says about a run besides its value (``Key.roles``). Each list of keys the platform needs is
# the keys of a role; the run hash has its own flags (``Key.in_run_hash``, ``hash_omit_when``,
# ``hash_null_when``) because kept runs fix what it holds (clients-per-message is transport, yet in the hash).
ROLES: dict[str, str] = {
    "location": "where the run's inputs, outputs or computation are, not what it computes: a seeded noise "
                "stream draws the same noise anywhere (noise_condition), the report card's conditions ignore it",
    "output": "where the run writes its folder (never part of its identity)",
    "transport": "how the same computation is carried or executed (message packing, waits, kernels, memory layout): "
                 "the report card groups runs across it",
    "deployment": "set by python -m deploy.export for a deployment with node-local data",
    "randomness": "where the DP noise's randomness comes from, not its distribution",
    "probe": "what an attack or audit captures or inserts (victims, canaries, shadow data): the report cards "
             "list such runs by other means",
    "replicate": "the seed: tables group runs over it",
}

# Keys every study reads. A study may narrow one (``COMMON_KEYS["num-clients"].refine(ge=2)``) in its
# KeyTable; it may not change its default (set it in a preset instead).
COMMON: tuple[Key, ...] = (
    Key("study", "dfl-dp", str, doc="the study to run (flower_apps/<study>/)"),
    Key("preset", "paper", str, doc="the study's preset: values for the keys left at their default"),
    Key("seed", 0, int, ge=0, roles={"replicate"},
        doc="seed of data splits, model init and client sampling (not of DP noise)"),
    # Where results go is not part of a run's identity: a results folder can move (or be cloned).
    Key("results-dir", "results", str, roles={"location", "output"}, in_run_hash=False,
        doc="folder under which each run writes <study>/runs/<run>/"),
    Key("run-name", "", str, parse=_run_name, allowed="'' or one folder name (no '/', '\\', '.' or '..')",
        roles={"location", "output"}, in_run_hash=False,
        doc="name of the run's folder under <results-dir>/<study>/runs/ ('' = derived from the config)"),
    # Sweeps skip finished runs either way; this decides what a single run (flwr run, in-process) does.
    Key("rerun", "refuse", str, choices=RERUN, in_run_hash=False,
        doc="when the run folder holds a finished run of this config: refuse "
        "(keep it; the run ends with an error naming the folder) or replace it"),
    Key("dataset", "mnist", str, doc="data source (each study lists the ones it reads)"),
    # No "location" role: the folder selects the data, so it stays in the run's identity and noise condition.
    Key("data-dir", "", str, doc="where the dataset's files are ('' = the default data home)"),
    Key("data-fraction", 1.0, float, gt=0, le=1, doc="fraction of the data used (fixed-seed subsample)"),
    Key("num-clients", 100, int, ge=1, doc="number of logical clients (nodes in the decentralized studies)"),
    Key("num-rounds", 100, int, ge=1, doc="number of training rounds"),
    Key("device", "auto", str, pattern=r"auto|cpu|cuda(:\d+)?", allowed="'auto', 'cpu', 'cuda', 'cuda:<i>'",
        roles={"location"}, doc="torch device of training and evaluation"),
    # Dead SuperNodes surface sooner (NODE_UNAVAILABLE after their heartbeat lapses, <= 60 s in flwr
    # 1.42); this bounds the wait for nodes that stay online but hang.
    Key("round-timeout", 3600.0, float, gt=0, unit="seconds", roles={"transport"}, in_run_hash=False,
        doc="wall seconds the ServerApp waits for one round's replies; missing ones count as failed"),
    # "" = secure (OS entropy, reproducible by nobody); a path = a LOCAL file whose content seeds the
    # noise the SERVER adds (research opt-in). The run config is the coordinator's: it never names a
    # client's seed file (ultrasound refuses this key; its clients read their own, client_app.py).
    Key("noise-seed-file", "", str, parse=_noise_seed_file, allowed="'' or a readable local file",
        roles={"location", "randomness"},
        doc="the server's DP noise randomness: '' = OS entropy; a path = the server's local seed file, "
            "mixed with the run's config hash (privacy/randomness.py); never a client's"),
)
COMMON_KEYS: dict[str, Key] = {k.name: k for k in COMMON}
COMMON_NAMES = frozenset(COMMON_KEYS)

# Keys several studies read: declared once here, listed by each study that reads them.
SHARED_KEYS: dict[str, Key] = {k.name: k for k in (
    Key("lr", 0.01, float, gt=0, doc="client learning rate"),
    Key("momentum", 0.9, float, ge=0, lt=1, doc="client SGD momentum"),
    Key("weight-decay", 5e-4, float, ge=0, doc="client L2 weight decay"),
    Key("batch-size", 128, int, ge=1, doc="client minibatch size"),
    Key("local-epochs", 1, int, ge=1, doc="client epochs per round"),
    Key("test-fraction", 0.2, float, gt=0, lt=1,
        doc="fraction of each client's (or the pooled) data held out for test"),
    Key("clients-per-message", 1, int, ge=1, roles={"transport"},
        doc="logical clients packed into one Flower message (transport only: the math is unchanged)"),
    Key("dirichlet-alpha", 0.5, float, gt=0, doc="Dirichlet concentration of the label skew across clients"),
    Key("delta-total", 1e-5, float, gt=0, lt=1, doc="delta at which the run's total epsilon is reported"),
    # Cross-silo deployment (docs/deployment.md): each SuperNode reads only its --node-config data-path.
    Key("node-local-data", False, bool, roles={"location", "deployment"},
        doc="deployment: each SuperNode trains on its node-config data-path; the server asks nodes what they hold"),
    Key("eval-data-path", "", str, roles={"location", "deployment"},
        doc="with node-local-data: the coordinator's held-out evaluation data from python -m deploy.export "
            "(.npz; ultrasound: a folder with test/ and val/ in the BUSI layout)"),
    # The audit's proof (issue 37): a deliberately broken mechanism, refused unless PPFL_ALLOW_DP_FAULTS=1.
    # '' (the correct mechanism) stays out of the run hash: runs kept before the key existed keep their identity.
    Key("dp-fault", "", str, parse=_dp_fault, allowed="'' (tests only: a fault of privacy/faults.py)",
        hash_omit_when={"dp-fault": ("",)},
        doc="'' = the correct DP mechanism; a name from privacy/faults.py injects that bug (the audit's tests "
            "only; refused unless PPFL_ALLOW_DP_FAULTS=1)"),
)}


class KeyTable:
    """The keys one study reads: the common keys (as the study refines them), then its own, in order."""

    def __init__(self, study: str, keys: Iterable[Key]) -> None:
        self.study = study
        table = dict(COMMON_KEYS)
        own: dict[str, Key] = {}
        seen: set[str] = set()
        for key in keys:
            if key.name in seen:
                raise ValueError(f"study {study!r} declares key {key.name!r} twice")
            seen.add(key.name)
            if key.name in COMMON_KEYS:
                if key.declaration() != COMMON_KEYS[key.name].declaration():
                    raise ValueError(f"study {study!r} redefines the common key {key.name!r}; "
                                     "set it in a preset instead")
                table[key.name] = key
            else:
                own[key.name] = key
        self.keys: dict[str, Key] = {**table, **own}
        self.own: tuple[Key, ...] = tuple(own.values())
        for key in self.keys.values():
            for what, cond in key.conditions().items():
                unknown = sorted(set(cond) - set(self.keys))
                if unknown:
                    raise ValueError(f"study {study!r}: key {key.name!r}'s {what} names keys {unknown} "
                                     "that are not in its key table")

    def with_role(self, role: str) -> tuple[Key, ...]:
        """The keys that have ``role`` (:data:`ROLES`), in table order."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; allowed: {sorted(ROLES)}")
        return tuple(k for k in self.keys.values() if role in k.roles)

    def identity(self, cfg: Any, *, with_output: bool = False) -> dict[str, Any]:
        """Field -> value of every key in ``cfg``'s run identity (see :func:`flower_apps.common.results.run_identity`).

        A key is in it unless ``in_run_hash`` is false (``with_output``: the ``output`` keys are in it
        too) or one of its ``hash_omit_when`` conditions holds; it is null while a ``hash_null_when``
        condition holds. Conditions read the config's values (any listed condition suffices).
        """
        values = dataclasses.asdict(cfg)
        by_key = {k.name: values[k.field] for k in self.keys.values() if k.field in values}

        def holds(cond: Mapping[str, Collection[Any]] | None) -> bool:
            return any(by_key[name] in allowed for name, allowed in (cond or {}).items())

        out = {}
        for key in self.keys.values():
            if key.name == "study" or key.field not in values:
                continue
            if not (key.in_run_hash or (with_output and "output" in key.roles)) or holds(key.hash_omit_when):
                continue
            out[key.field] = None if holds(key.hash_null_when) else values[key.field]
        return out

    def __contains__(self, name: str) -> bool:
        return name in self.keys

    def defaults(self) -> dict[str, Any]:
        return {name: key.default for name, key in self.keys.items()}

    def check(self, c: dict[str, Any]) -> dict[str, Any]:
        """Every single-key check, in table order; key name -> value converted for the dataclass.

        Then a key set for a choice that does not read it (``Key.unused_when``) is refused.
        """
        out = {name: key.check(c[name]) for name, key in self.keys.items()}
        for name, key in self.keys.items():
            for other, values in (key.unused_when or {}).items():
                if c[other] in values and c[name] != key.default:
                    raise ConfigError(f"{name}: {other} {c[other]!r} does not read {name}, got {c[name]!r}; "
                                      f"allowed with {other} {c[other]!r}: {toml_text(key.default)} (the default)")
        return out

    def build(self, cls: type[_C], c: dict[str, Any]) -> _C:
        """The config dataclass ``cls`` from a flat run config: each field from the key that fills it."""
        values = self.check(c)
        names = {f.name for f in dataclasses.fields(cast(Any, cls))}  # a config class: a dataclass
        kwargs = {key.field: values[key.name] for key in self.keys.values() if key.field in names}
        missing = sorted(names - set(kwargs))
        if missing:
            raise TypeError(f"{cls.__name__} fields {missing} are filled by no key of study {self.study!r}")
        return cls(**kwargs)

    def config_class(self, name: str, *, base: type | None = None, run_name: Iterable[str] = (),
                     doc: str = "") -> type:
        """A frozen config dataclass derived from this table: one field per key (``Key.field``, its
        default :meth:`Key.default_value`; ``study`` and keys not ``held`` are left out), so a study declares each key once and
        never restates it as a field. Use it with :meth:`build`.

        ``base``: a plain class (no fields) with what the study derives from the fields (``condition``,
        ``default_run_name``, ...). Every config class also has :class:`RunConfig`'s ``to_json`` /
        ``from_json`` and ``key_table`` (this table: the run's identity and roles read it). Fields are
        keyword-only. Without a
        ``default_run_name`` in ``base``, the run folder's name (when ``run-name`` is '') is
        ``<preset>[_<key><value>...]_s<seed>`` over the ``run_name`` keys: name the keys a sweep varies, or two
        runs share a folder (the sweeps refuse that before any run starts).
        """
        fields_of = {key.name: key for key in self.keys.values() if key.name != "study" and key.held}
        naming = tuple(run_name)
        unknown = [k for k in naming if k not in fields_of]
        if unknown:
            raise ValueError(f"study {self.study!r}: run_name keys {unknown} are not in its key table")
        if base is not None and dataclasses.is_dataclass(base):
            raise TypeError(f"{name}: base {base.__name__} is a dataclass; its fields would restate keys "
                            "(give it properties and methods only)")
        named_by_base = base is not None and hasattr(base, "default_run_name")
        if named_by_base and naming:
            assert base is not None  # named_by_base implies a base
            raise ValueError(f"{name}: base {base.__name__} names the run folder (default_run_name); "
                             "give run_name keys or a base default_run_name, not both")

        def default_run_name(cfg: Any) -> str:
            parts = [cfg.preset] + [f"{k}{toml_text(getattr(cfg, fields_of[k].field)).strip(chr(39))}"
                                    for k in naming]
            return "_".join(parts) + f"_s{cfg.seed}"

        namespace: dict[str, Any] = {"key_table": self}
        if not named_by_base:
            namespace["default_run_name"] = property(default_run_name)
        specs = [(key.field, tuple if key.many else key.type, dataclasses.field(default=_field_default(key)))
                 for key in fields_of.values()]
        bases = (base, RunConfig) if base is not None else (RunConfig,)
        # keyword-only: a field whose key the study narrows past its default (tabular-pdp's dataset) has none
        cls = dataclasses.make_dataclass(name, specs, bases=bases, frozen=True, kw_only=True, namespace=namespace)
        cls.__doc__ = doc or f"One run of study {self.study!r}: a field per key of its table (KeyTable.config_class)."
        # Pickle finds the class where the study binds it: the calling module, under ``name``.
        cls.__module__ = sys._getframe(1).f_globals.get("__name__", __name__)
        # What the type checker is shown (flower_apps.keys.render_fields writes it to <module>_fields.py)
        fields = tuple(FieldSpec(key.field, _annotation(key), spec[2].default)
                       for key, spec in zip(fields_of.values(), specs))
        CONFIG_CLASSES.append(ConfigClass(cls, self, fields, names_run=not named_by_base))
        return cls


@dataclass(frozen=True)
class FieldSpec:
    """One field of a derived config class: its name, its annotation as source text, its default."""

    name: str
    annotation: str
    default: Any  # dataclasses.MISSING: none (the study's refinement refuses the key's default)


@dataclass(frozen=True)
class ConfigClass:
    """A class made by :meth:`KeyTable.config_class`, with what its typed view needs."""

    cls: type
    table: KeyTable
    fields: tuple[FieldSpec, ...]
    names_run: bool  # config_class added ``default_run_name`` (the base does not define it)


#: Every config class derived so far (``scripts/sync_run_keys.py`` writes the type checker's view of each).
CONFIG_CLASSES: list[ConfigClass] = []


def _annotation(key: Key) -> str:
    """The field's type as source text: the ``parse`` function's declared return type where it converts."""
    if key.many:
        return "tuple[str, ...]"
    if key.parse is not None:
        ret = getattr(key.parse, "__annotations__", {}).get("return")
        if ret is None:
            raise TypeError(f"key {key.name}: its parse function {key.parse.__qualname__} declares no return type "
                            "(the config field's type is read from it)")
        return ret if isinstance(ret, str) else ret.__name__
    return key.type.__name__


def _field_default(key: Key) -> Any:
    """The field's default: the key's checked default, none where the study's refinement refuses it."""
    try:
        return key.default_value()
    except ConfigError:
        return dataclasses.MISSING


class RunConfig:
    """What every config class derived by :meth:`KeyTable.config_class` has besides its fields."""

    key_table: ClassVar[KeyTable]

    def to_json(self) -> str:
        """Serialized form carried in every message."""
        return json.dumps(dataclasses.asdict(cast(Any, self)), sort_keys=True)  # the derived class is a dataclass

    @classmethod
    def from_json(cls, text: str) -> Any:
        """Inverse of :meth:`to_json` (JSON lists back to the tuples the fields hold)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(text).items()})


def key_table_of(cfg: Any) -> KeyTable:
    """The key table ``cfg``'s class was derived from (:meth:`KeyTable.config_class`); TypeError otherwise."""
    table = getattr(type(cfg), "key_table", None)
    if not isinstance(table, KeyTable) or not dataclasses.is_dataclass(cfg):
        raise TypeError(f"{type(cfg).__name__} is not a config class of a key table: derive it with "
                        "KEYS.config_class (its keys say what is in the run's identity)")
    return table


# Every registered key (flower_apps.studies adds each study's on registration).
DECLARED: dict[str, Key] = dict(COMMON_KEYS)
RUN_CONFIG_DEFAULTS: dict[str, Any] = {k.name: k.default for k in COMMON}


def pyproject_defaults(path: str | Path | None = None) -> dict[str, Any]:
    """``[tool.flwr.app.config]`` of the project's pyproject.toml."""
    path = Path(path) if path else Path(__file__).resolve().parents[1] / "pyproject.toml"
    with open(path, "rb") as fh:
        return tomllib.load(fh)["tool"]["flwr"]["app"]["config"]


@dataclass(frozen=True)
class StudySpec:
    """What the router needs to know about a study."""

    name: str
    action: str  # ClientApp action: its messages are "train.<action>", "evaluate.<action>", "query.<action>"
    keys: KeyTable
    presets: dict[str, dict[str, Any]]
    build_config: Any  # Callable[[dict], frozen dataclass], raises ConfigError
    server_main: Any  # Callable[[Grid, config], dict]  (returns the run summary)
    client_train: Any  # Callable[[Message, Context], Message]: "train.<action>" (train, reply with models)
    # Callable[[config], int]: the SuperNodes a run needs (simulations start that many); default_nodes
    nodes: Any = None
    card: Any = None  # flower_apps.common.report_card.CardSpec: the study's report card (python -m flower_apps.report)
    client_evaluate: Any = None  # "evaluate.<action>": score the received model (None: the study sends none)
    client_query: Any = None  # "query.<action>": report something, train nothing (node-data discovery, ...)
    # Generated parts of README.md / docs (flower_apps.common.doc_blocks): block name -> render(root),
    # value namespace -> values(root); a built-in study's docs.py BLOCKS / VALUES
    doc_blocks: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    doc_values: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def handlers(self) -> dict[str, Any]:
        """Flower message type (``train`` / ``evaluate`` / ``query``) -> the study's ClientApp handler."""
        return {kind: fn for kind, fn in (("train", self.client_train), ("evaluate", self.client_evaluate),
                                          ("query", self.client_query)) if fn is not None}

    def nodes_needed(self, cfg: Any) -> int:
        """SuperNodes a run of ``cfg`` needs: the study's ``nodes`` rule, else :func:`default_nodes`."""
        n = (self.nodes or default_nodes)(cfg)
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"study {self.name!r}: its nodes rule gave {n!r} SuperNodes; expected an int >= 1")
        return n


def default_nodes(cfg: Any) -> int:
    """ceil(num_clients / clients_per_message): one SuperNode per message of a round that trains every client.

    A config without ``num_clients`` is refused: its study must say how many nodes it needs (a
    ``nodes_needed(cfg)`` in its config.py, or ``StudySpec.nodes``) rather than get a guess.
    """
    if not hasattr(cfg, "num_clients"):
        raise ValueError(f"{type(cfg).__name__} has no num_clients: give the study a nodes rule "
                         "(nodes_needed(cfg) in its config.py, or StudySpec(nodes=...))")
    return max(1, -(-int(cfg.num_clients) // int(getattr(cfg, "clients_per_message", 1))))


def resolve(raw: dict[str, Any], studies: dict[str, StudySpec],
            given: Iterable[str] | None = None) -> tuple[StudySpec, dict[str, Any]]:
    """Validate keys, apply the study's preset, check every value; return (spec, flat resolved config).

    Order: unknown keys; study and preset; every value's type (finite for numbers); then the
    range/choices of each key the study reads. The study's cross-field rules follow in build_config.

    Precedence: defaults < the preset < what the user set. Flower hands the ServerApp every key
    (pyproject's defaults fused with the user's ``--run-config``), so ``given`` names the keys the
    user set (``grid.run.override_config``, in-process overrides): those win even when their value
    equals the default (``lr=0.01`` with a preset whose lr is 1e-3). Without ``given``, a value that
    differs from the default counts as set.
    """
    check_keys(raw)
    study = raw.get("study", RUN_CONFIG_DEFAULTS["study"])
    if study not in studies:
        raise ConfigError(f"study={study!r} is not a study; allowed: {sorted(studies)}")
    spec = studies[study]
    preset = raw.get("preset", RUN_CONFIG_DEFAULTS["preset"])
    if preset not in spec.presets:
        raise ConfigError(f"preset={preset!r} is not a preset of study {study!r}; allowed: {sorted(spec.presets)}")
    named = set(given or ())
    explicit = {k: v for k, v in raw.items() if k in named or v != RUN_CONFIG_DEFAULTS[k]}
    resolved = {**RUN_CONFIG_DEFAULTS, **spec.presets[preset], **explicit}
    for key, val in resolved.items():  # other studies' keys too: no inf/nan/ill-typed value anywhere
        spec.keys.keys.get(key, DECLARED[key]).check_type(val)
    spec.keys.check(resolved)
    return spec, resolved


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
