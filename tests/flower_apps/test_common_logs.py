"""Each Flower log line is printed once during our simulations (it was printed twice)."""

from __future__ import annotations

import io
import logging
from contextlib import contextmanager

import flwr.common.logger as flwr_logger

import flower_apps.engine as engine
from flower_apps.common.logs import flower_logs_once


@contextmanager
def _console_as_in_a_sweep(buf: io.StringIO):
    """Flower's console handler and the root handler opacus' import-time ``logging.basicConfig`` adds, into ``buf``."""
    root_handler = logging.StreamHandler(buf)
    root_handler.setFormatter(logging.Formatter("%(asctime)s:%(levelname)s:%(message)s", "%m/%d/%Y %H:%M:%S"))
    old_stream = flwr_logger.console_handler.setStream(buf)
    logging.getLogger().addHandler(root_handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(root_handler)
        flwr_logger.console_handler.setStream(old_stream)


def _count(buf: io.StringIO, text: str) -> int:
    return sum(text in line for line in buf.getvalue().splitlines())


def test_the_cause_one_record_reaches_two_handlers():
    buf = io.StringIO()
    with _console_as_in_a_sweep(buf):
        logging.getLogger("flwr").info("twice without the fix")
    assert _count(buf, "twice without the fix") == 2


def test_flower_logs_once_prints_one_line_and_restores_propagation():
    buf = io.StringIO()
    before = logging.getLogger("flwr").propagate
    with _console_as_in_a_sweep(buf), flower_logs_once():
        logging.getLogger("flwr").info("once with the fix")
    assert _count(buf, "once with the fix") == 1
    assert logging.getLogger("flwr").propagate is before


def test_the_in_process_adapter_runs_flower_inside_the_fix(monkeypatch):
    buf = io.StringIO()

    def fake_run_simulation(**kwargs):
        logging.getLogger("flwr").info("[ROUND 1/1] from the simulation")

    monkeypatch.setattr(engine, "run_simulation", fake_run_simulation)
    with _console_as_in_a_sweep(buf):
        engine.simulate(engine.ServerApp(), 1)
    assert _count(buf, "[ROUND 1/1] from the simulation") == 1


def test_in_a_fresh_process_with_opacus_imported_a_line_is_printed_once():
    import subprocess
    import sys

    # plain opacus import: its module_utils calls basicConfig; flwr.serverapp (as in every run) sets up Flower's
    # logger (strategies.flwr_adapter reads its name lazily, so flower_apps.common.logs alone does not)
    code = ("import logging, opacus, flwr.serverapp, privacy.dpsgd\n"
            "from flower_apps.common.logs import flower_logs_once\n"
            "log = logging.getLogger('flwr')\n"
            "log.info('line A')\n"
            "with flower_logs_once():\n"
            "    log.info('line B')\n")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert (err.count("line A"), err.count("line B")) == (2, 1)
