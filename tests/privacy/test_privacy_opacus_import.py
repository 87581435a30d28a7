"""Importing the project (and with it Opacus) leaves the root logger alone: Flower's lines print once."""

import subprocess
import sys

CODE = """
import logging
import flower_apps.router  # registers every study: imports opacus via privacy.dpsgd and privacy.accounting
import opacus
from flwr.common.logger import log
print("root-handlers", len(logging.getLogger().handlers))
log(logging.INFO, "one-line-marker")
"""


def test_importing_the_project_adds_no_root_handler_and_flower_lines_print_once():
    res = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "root-handlers 0" in res.stdout
    assert (res.stdout + res.stderr).count("one-line-marker") == 1, res.stdout + res.stderr


def test_plain_opacus_import_would_have_added_one():
    """The premise: Opacus' own import configures the root logger (so the guard is needed)."""
    res = subprocess.run([sys.executable, "-c", "import logging, opacus; print(len(logging.getLogger().handlers))"],
                         capture_output=True, text=True, timeout=300)
    assert res.stdout.strip() == "1", res.stdout + res.stderr
