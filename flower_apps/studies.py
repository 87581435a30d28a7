"""The study registry: study name -> StudySpec. New studies register here."""

from __future__ import annotations

from flower_apps.config import StudySpec

STUDIES: dict[str, StudySpec] = {}


def register_study(spec: StudySpec) -> None:
    """Add a study; duplicate names and actions are refused."""
    if spec.name in STUDIES:
        raise ValueError(f"study {spec.name!r} is already registered")
    if any(s.action == spec.action for s in STUDIES.values()):
        raise ValueError(f"ClientApp action {spec.action!r} is already used")
    STUDIES[spec.name] = spec


def _register_builtin() -> None:
    from flower_apps.dfl_dp import client_app as dfl_client
    from flower_apps.dfl_dp import config as dfl_config
    from flower_apps.dfl_dp import server_app as dfl_server

    register_study(StudySpec(dfl_config.STUDY, dfl_config.ACTION, dfl_config.PRESETS, dfl_config.build_config,
                             dfl_server.server_main, dfl_client.train))


_register_builtin()
