"""Root ServerApp/ClientApp: dispatch on ``study`` to the pair in ``flower_apps/<study>/``.

ServerApp: resolve and validate the run config (before any training), then hand the
study's frozen config to its ``server_main``. ClientApp: each study registers one action and a
handler per Flower message type it answers (``StudySpec.handlers``): ``train.<action>`` reaches
its ``client_train``, ``evaluate.<action>`` its ``client_evaluate``, ``query.<action>`` its
``client_query``; a type it registers no handler for is refused by Flower's ClientApp ("No
evaluate function registered ..."), never routed to another handler. Clients read their
settings from the message, never from ``context.run_config``, so the same ClientApp serves
flwr run, in-process simulation, sweeps and deployments.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from datasets.base import DataError
from flower_apps.common.ray_notices import hide_metrics_agent_notices
from flower_apps.config import ConfigError, resolve
from flower_apps.studies import STUDIES

log = logging.getLogger("flwr")

# A run refused before any work (bad config or data) is the user's input, not a crash.
REFUSALS = (ConfigError, DataError)


class OneLineRefusals(logging.Filter):
    """Log a refused run as one line instead of a traceback.

    Flower logs any ServerApp exception with its traceback (``exc_info``). For the refusals
    above the message already names the key or file at fault, so the record is rewritten to
    that one line; the run still ends as failed. Every other exception keeps its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, REFUSALS):
            record.msg, record.args = "run refused before any work: %s", (str(exc),)
            record.exc_info, record.exc_text = None, None
        return True


def install_one_line_refusals() -> None:
    """Add :class:`OneLineRefusals` to Flower's logger once (public logging API, no patching)."""
    if not any(isinstance(f, OneLineRefusals) for f in log.filters):
        log.addFilter(OneLineRefusals())


def prepare(raw: dict[str, Any], given: Iterable[str] | None = None):
    """(spec, study config) from a raw run config; raises ConfigError naming the bad key.

    ``given``: the keys the user set (they win over the preset even at their default value).
    """
    spec, flat = resolve(dict(raw), STUDIES, given)
    return spec, spec.build_config(flat)


def prepare_run(run_config: dict[str, Any], user_set: dict[str, Any], overrides: dict[str, Any] | None = None):
    """(spec, study config) of a ServerApp run.

    ``run_config`` is Flower's fused run config (pyproject defaults + the user's values), ``user_set``
    the Run's override config (what `flwr run --run-config` set), ``overrides`` in-process values on
    top. The keys in the last two win over the preset even at their default value.
    """
    from flower_apps.config import RUN_CONFIG_DEFAULTS

    raw = {**RUN_CONFIG_DEFAULTS, **run_config, **(overrides or {})}
    return prepare(raw, given={*user_set, *(overrides or {})})


def make_server_app(overrides: dict[str, Any] | None = None) -> ServerApp:
    """A ServerApp; ``overrides`` (for in-process runs) are applied on top of the run config."""
    app = ServerApp()
    install_one_line_refusals()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        hide_metrics_agent_notices()  # in flwr-simulation, where the Ray driver runs beside this ServerApp
        spec, cfg = prepare_run(dict(context.run_config), dict(grid.run.override_config), overrides)
        check_export_config(spec, cfg)  # a node-local run must have the config its folders were exported for
        log.info("study %s, config %s", spec.name, cfg)
        spec.server_main(grid, cfg)

    return app


def register_handlers(app: ClientApp, spec) -> None:
    """Register ``spec``'s handlers on ``app``, each under its message type and the study's action."""
    decorators = {"train": app.train, "evaluate": app.evaluate, "query": app.query}
    for kind, handler in spec.handlers().items():
        decorators[kind](spec.action)(handler)


def make_client_app() -> ClientApp:
    """The ClientApp with each registered study's handlers (train, and evaluate / query where it has them)."""
    app = ClientApp()
    for spec in STUDIES.values():
        register_handlers(app, spec)
    return app


server_app = make_server_app()
client_app = make_client_app()


EXPORT_RECORD = "export.json"  # what `python -m deploy.export` writes next to coordinator/ (per study)


def export_record(study: str, eval_data_path: str) -> tuple[Path, dict] | None:
    """(export.json, its record of ``study``) when ``eval_data_path`` lies in a ``deploy.export`` folder
    (``<out>/coordinator/<study>/...``), else None."""
    import json

    if not eval_data_path:
        return None
    p = Path(eval_data_path).resolve()
    for parent in list(p.parents)[:3]:
        if parent.name == "coordinator" and (parent.parent / EXPORT_RECORD).is_file():
            path = parent.parent / EXPORT_RECORD
            try:
                rec = json.loads(path.read_text()).get(study)
            except (OSError, ValueError, AttributeError):
                return None
            return (path, rec) if isinstance(rec, dict) and isinstance(rec.get("run_config"), dict) else None
    return None


def check_export_config(spec: Any, cfg: Any) -> None:
    """Refuse a node-local run whose config differs from the one its data folders were exported for.

    The export deals clients to nodes by ``seed``, ``num-clients``, ``clients-per-message``, ...; a
    ``flwr run`` that leaves one out gets the preset's value and asks nodes for clients they do not hold
    (issue 41, item 1). Found through ``eval-data-path`` (``<out>/coordinator/<study>/``): a ConfigError
    naming every differing key with the exported value and the one this run has, before any work.
    """
    from flower_apps.config import RUN_CONFIG_DEFAULTS
    from flower_apps.errors import ConfigError

    if not getattr(cfg, "node_local_data", False):
        return
    found = export_record(spec.name, str(getattr(cfg, "eval_data_path", "") or ""))
    if found is None:
        return
    path, rec = found
    exported = dict(rec["run_config"])
    _, want = prepare({**RUN_CONFIG_DEFAULTS, **exported}, given=exported)
    keys = spec.keys.keys
    differ = []
    for name in exported:
        key = keys.get(name)
        if key is None or name in ("study", "eval-data-path", "node-local-data"):
            continue
        if getattr(want, key.field, None) != getattr(cfg, key.field, None):
            differ.append((name, getattr(want, key.field, None), getattr(cfg, key.field, None)))
    if differ:
        def toml(v):
            return ("true" if v else "false") if isinstance(v, bool) else (f"'{v}'" if isinstance(v, str) else str(v))

        raise ConfigError(f"{spec.name}: this node-local run differs from what {path} records for its data folders: "
                          + ", ".join(f"{n} is {toml(have)}, exported with {toml(v)}" for n, v, have in differ)
                          + "; pass --run-config \"" + " ".join(f"{n}={toml(v)}" for n, v, _ in differ) + "\" "
                          "(the coordinator line `python -m deploy.export` printed has every key)")
