"""round-timeout has one meaning in every study: wall seconds the ServerApp waits for one round's replies.

Each test runs a study's ``server_main`` on an in-process grid where some messages are never
answered (a node that stays online but hangs). The grid records how long the server kept polling
for each of them: that wait must be the configured round-timeout (not the old hard-coded hour, not
zero); then the client counts as failed and the run goes on (dfl-dp, tabular-pdp) or, where every
client is needed (ultrasound, unlinkable-dfl), stops with a message naming the missing one.
"""

from __future__ import annotations

import time

import pytest
import torch
from flwr.app import Context, Message, RecordDict

from flower_apps.common.results import read_jsonl
from flower_apps.config import RUN_CONFIG_DEFAULTS
from flower_apps.router import prepare
from strategies.transport import send_and_receive

torch.set_num_threads(1)
TIMEOUT = 1.0  # seconds; short enough for the suite, long enough to tell apart from "no wait"
GRACE = 5.0  # a server still polling after TIMEOUT + GRACE does not honour round-timeout: fail fast


@pytest.fixture
def hanging_grid_cls(fake_grid_cls):
    class HangingGrid(fake_grid_cls):
        """A FakeGrid whose messages matching ``hang(node, message)`` are never answered.

        ``waits``: per unanswered message, seconds from its push to the server's last poll for it.
        """

        def __init__(self, node_ids, handler, hang):
            super().__init__(node_ids, handler)
            self.hang = hang
            self.pushed: dict[str, float] = {}
            self.waits: dict[str, float] = {}

        def push_messages(self, messages):
            messages = list(messages)
            hung = [m for m in messages if self.hang(m.metadata.dst_node_id, m)]
            ids = super().push_messages(messages)
            now = time.monotonic()
            for mid, msg in zip(ids, messages):
                if any(msg is h for h in hung):
                    self.replies.pop(mid, None)
                    self.pushed[mid] = now
            return ids

        def pull_messages(self, ids):
            ids = list(ids)
            now = time.monotonic()
            for mid in ids:
                if mid in self.pushed:
                    self.waits[mid] = now - self.pushed[mid]
                    assert self.waits[mid] < TIMEOUT + GRACE, "the server waits longer than round-timeout"
            return super().pull_messages(ids)

        def send_and_receive(self, messages, *, timeout=None):  # as Flower's Grid: poll until timeout
            return send_and_receive(self, messages, timeout=timeout)

    return HangingGrid


def _cfg(tmp_path, **over):
    return prepare({**RUN_CONFIG_DEFAULTS, "preset": "smoke", "round-timeout": TIMEOUT,
                    "results-dir": str(tmp_path), **over})[1]


def _client_ids(msg: Message) -> list[int]:
    return [int(c) for c in msg.content["config"].get("client-ids", [])]


def _assert_waited_round_timeout(grid, n_waits: int) -> None:
    assert len(grid.waits) == n_waits, grid.waits
    for waited in grid.waits.values():
        assert TIMEOUT - 0.05 <= waited < TIMEOUT + 1.0, grid.waits


def test_dfl_dp_waits_round_timeout_then_counts_the_silent_cohort_failed(tmp_path, hanging_grid_cls):
    from flower_apps.dfl_dp import client_app
    from flower_apps.dfl_dp.server_app import run_dir, server_main

    cfg = _cfg(tmp_path, **{"study": "dfl-dp", "num-rounds": 1, "num-clients": 4, "clients-per-message": 2})
    grid = hanging_grid_cls([1, 2], lambda node, msg: client_app.train(msg, Context(1, node, {}, RecordDict(), {})),
                            hang=lambda node, msg: node == 2)  # clients 2 and 3
    server_main(grid, cfg)
    _assert_waited_round_timeout(grid, 1)
    (row,) = read_jsonl(run_dir(cfg) / "rounds.jsonl")  # the round went on without them
    assert (row["num_contributors"], row["num_failed"]) == (2, 2)


def test_tabular_pdp_phases_and_rounds_wait_round_timeout(tmp_path, hanging_grid_cls):
    from flower_apps.router import client_app
    from flower_apps.tabular_pdp.server_app import server_main

    cfg = _cfg(tmp_path, **{"study": "tabular-pdp", "num-clients": 4, "num-rounds": 1, "local-epochs": 1,
                            "tab-settings": "vanilla", "tab-drift-exclude": False})
    fits = {"n": 0}

    def hang(node, msg):  # client 3 answers its first fit (drift detection), then hangs in every fit
        if _client_ids(msg) != [3] or msg.metadata.message_type != "train.tabular_pdp":
            return False
        fits["n"] += 1
        return fits["n"] > 1

    grid = hanging_grid_cls([1], lambda node, msg: client_app(msg, None), hang)
    summary = server_main(grid, cfg)
    # one wait in phases.exchange (the clip-norm estimate's fit), one in Strategy.start (the vanilla round)
    _assert_waited_round_timeout(grid, 2)
    assert summary["detection_failures"] == {"3": "no reply"}
    assert 3 in summary["participants"] and 3 not in summary["settings"]["vanilla"]["per_client"]


def test_ultrasound_waits_round_timeout_then_names_the_missing_client(tmp_path, hanging_grid_cls):
    from flower_apps.ultrasound import client_app
    from flower_apps.ultrasound.server_app import server_main

    cfg = _cfg(tmp_path, **{"study": "ultrasound", "dataset": "synthetic", "num-clients": 2, "num-rounds": 1,
                            "local-epochs": 1, "data-fraction": 0.25, "us-image-size": 32, "us-pretrained": False})
    grid = hanging_grid_cls([101, 102],
                            lambda node, msg: client_app.train(msg, Context(1, node, {}, RecordDict(), {})),
                            hang=lambda node, msg: node == 102)
    with pytest.raises(RuntimeError, match="client 1: no reply before the timeout"):  # every client is needed
        server_main(grid, cfg)
    _assert_waited_round_timeout(grid, 1)


def test_unlinkable_dfl_waits_round_timeout_then_names_the_missing_node(tmp_path, hanging_grid_cls):
    from flower_apps.unlinkable_dfl import client_app
    from flower_apps.unlinkable_dfl.server_app import server_main

    cfg = _cfg(tmp_path, **{"study": "unlinkable-dfl", "num-clients": 3, "num-rounds": 1, "udfl-degree": 2,
                            "clients-per-message": 2, "udfl-eval-samples": 50})
    assert cfg.virtual_round_timeout == 120.0 and cfg.round_timeout == TIMEOUT  # two keys, two meanings
    grid = hanging_grid_cls([1, 2], lambda node, msg: client_app.train(msg, None),
                            hang=lambda node, msg: node == 2)  # plays logical node 2 (nodes 0, 1 share node 1)
    with pytest.raises(RuntimeError, match="node 2: no reply before the timeout"):
        server_main(grid, cfg)
    _assert_waited_round_timeout(grid, 1)
