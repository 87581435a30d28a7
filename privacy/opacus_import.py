"""Import Opacus without its import-time ``logging.basicConfig``.

``opacus/utils/module_utils.py`` calls ``logging.basicConfig`` when Opacus is imported, giving the root
logger a stderr handler in every process that imports it (the ServerApp and ClientApp processes of
``flwr run`` included): each Flower log line then printed twice, once by Flower's handler and once,
propagated, by the root's. ``basicConfig`` does nothing when the root logger already has a handler,
so Opacus is imported here with a temporary ``NullHandler`` in place. Nothing of Opacus is changed.
"""

from __future__ import annotations

import importlib
import logging
import sys


def import_opacus() -> None:
    """Import ``opacus`` once, leaving the root logger's handlers as they were."""
    if "opacus" in sys.modules:
        return
    root = logging.getLogger()
    guard = logging.NullHandler()
    root.addHandler(guard)
    try:
        importlib.import_module("opacus")
    finally:
        root.removeHandler(guard)
