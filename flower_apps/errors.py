"""The run-config refusal type, in a module of its own.

flower_apps.config and flower_apps.common.results both need it, and config.py imports results
(the run's identity): defined here, neither imports the other to raise it.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A run config that cannot run; the message names the key and the allowed values."""
