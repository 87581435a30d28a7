"""Console logging of in-process Flower runs: every record printed once.

Flower's ``flwr`` logger prints through its own console handler and also propagates to the
root logger. Importing opacus (``opacus/utils/module_utils.py``, via ``privacy.dpsgd``) calls
``logging.basicConfig``, which gives the root logger a stderr handler of its own, so each
Flower line came out twice (``INFO : msg`` and ``date:INFO:msg``), DEBUG lines once
(root's handler has no level). Flower turns propagation off for the same reason in notebooks
(``set_logger_propagation`` in ``run_simulation``); we do it around our own simulations only,
and put it back afterwards (pytest's ``caplog`` listens at the root).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from strategies.flwr_adapter import flower_logger_name


@contextmanager
def flower_logs_once() -> Iterator[None]:
    """Within the block, Flower's records reach only Flower's console handler (and its own file/HTTP ones)."""
    logger = logging.getLogger(flower_logger_name())
    before = logger.propagate
    logger.propagate = False
    try:
        yield
    finally:
        logger.propagate = before
