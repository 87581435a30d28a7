"""Shared fixtures: a fake Flower grid that runs handlers in-process, seeded generators."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Error, Message

from strategies.flwr_adapter import task_identity

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# The suite runs hundreds of short runs; through the default engine (one flwr run each on a local SuperLink,
# flower_apps.runner) each would cost ~26 s more. Tests that are about an engine name it
# (tests/flower_apps/test_engines.py checks both give the same numbers, and that superlink is the default).
os.environ.setdefault("PPFL_ENGINE", "inprocess")


@pytest.fixture(autouse=True)
def _task_identity():
    """Flower's Message needs a task identity; the simulation sets it, unit tests set a dummy one."""
    with task_identity(replace=True):
        yield


class FakeGrid:
    """A Grid whose nodes answer synchronously by calling ``handler(node_id, message) -> Message``.

    ``fail_nodes``: nodes that answer with an error; ``silent_nodes``: nodes that never answer.
    Every delivered message is recorded in ``log`` (node id, message) in delivery order.
    """

    def __init__(self, node_ids: list[int], handler: Callable[[int, Message], Message],
                 fail_nodes: set[int] | None = None, silent_nodes: set[int] | None = None) -> None:
        self.node_ids = list(node_ids)
        self.handler = handler
        self.fail_nodes = fail_nodes or set()
        self.silent_nodes = silent_nodes or set()
        self.replies: dict[str, Message] = {}
        self.log: list[tuple[int, Message]] = []

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            mid = str(uuid.uuid4())
            m.metadata.__dict__["_message_id"] = mid
            node = m.metadata.dst_node_id
            self.log.append((node, m))
            if node in self.silent_nodes:
                ids.append(mid)
                continue
            if node in self.fail_nodes:
                reply = Message(Error(code=1, reason=f"node {node} crashed"), reply_to=m)
            else:
                reply = self.handler(node, m)
            self.replies[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in list(ids) if i in self.replies]

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(messages))

    def run_round(self, strategy, arrays, rnd: int = 1) -> tuple:
        """One training round of ``strategy`` on this grid from the model ``arrays`` (name -> ndarray):
        (aggregated ArrayRecord or None, metrics, the messages it sent)."""
        from flwr.app import ConfigRecord

        from strategies.records import from_numpy

        g = strategy.prepare_grid(self)
        msgs = list(strategy.configure_train(rnd, from_numpy(arrays), ConfigRecord({"run-config": "{}"}), g))
        replies = g.send_and_receive(msgs, timeout=5)
        return (*strategy.aggregate_train(rnd, replies), msgs)


@pytest.fixture
def fake_grid_cls():
    return FakeGrid


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


# The suite runs on pytest-xdist workers, one module per worker at a time (scripts/run_tests.sh:
# ``--dist loadscope --no-loadscope-reorder``). A module is handed out in collection order, so the longest
# ones go first and the short ones fill the gaps (longest-first scheduling). Measured serially on the 2-core
# machine (session 9, ``--durations``): these four modules took ~690, ~160, ~110 and ~70 s of ~1,500 s; the
# first mostly waits on Flower's 3 s polls and its SuperNodes' ClientApp processes, beside the CPU-bound rest.
LONGEST_MODULES = (
    "deploy/test_node_local_federation.py",
    "deploy/test_deploy_federation.py",
    "flower_apps/test_dfl_dp_smoke.py",
    "deploy/test_deploy_ray_cluster.py",
)


def _schedule_rank(item) -> int:
    path = item.path.as_posix()
    for rank, module in enumerate(LONGEST_MODULES):
        if path.endswith("tests/" + module):
            return rank
    return len(LONGEST_MODULES) + (0 if "slow" in item.keywords else 1)


def pytest_configure(config):
    # Two workers on two cores: one intra-op thread each, not two each (no oversubscription).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "shared" in item.keywords and not SHARED_DATA.is_dir():
            item.add_marker(pytest.mark.skip(reason=f"../shared/data not found at {SHARED_DATA}"))
    items.sort(key=_schedule_rank)  # stable: a module's tests keep their order


REPO = Path(__file__).resolve().parents[1]


def _repository_files() -> dict[str, tuple[int, int]] | None:
    """What git keeps here (tracked, or new and not ignored): path -> (size, mtime); None outside a checkout."""
    import subprocess

    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    files = {}
    for name in filter(None, out.stdout.decode().split("\0")):
        try:
            st = (REPO / name).stat()
        except FileNotFoundError:
            continue
        files[name] = (st.st_size, st.st_mtime_ns)
    return files


def pytest_sessionstart(session):
    # A test that writes into the repository (a README, a kept results file) corrupts what CI and the docs check
    # read: it once replaced results_bench/benchmarks.json with a test's fake rows. The controller notes every
    # kept file before the run and fails the session if one changed (tests write under tmp_path instead).
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        session.config._repository_files = _repository_files()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_repository_files", None)
    if before is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    after = _repository_files() or {}
    changed = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
    if changed:
        shown = ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")
        print(f"\nERROR: the test session changed files of the repository: {shown} (a test must write under "
              "tmp_path; if you edited them during the run, rerun)", flush=True)
        session.exitstatus = 1
