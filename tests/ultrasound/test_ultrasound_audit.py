"""The ultrasound study's one-run DP-SGD audit: canaries, the grid view, scores, the run keys, `sweep --audit` end to end."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp.strategy import Strategy

from flower_apps.common.results import read_json
from flower_apps.config import ConfigError
from flower_apps.ultrasound import audit
from flower_apps.ultrasound.audit import AuditRecords, AuditRequest, AuditTap, make_canaries, scores


def _cfg(**keys):
    """The config `flwr run --run-config "study='ultrasound' preset='smoke' ..."` would build."""
    from flower_apps.router import prepare

    return prepare({"study": "ultrasound", "preset": "smoke", **keys})[1]


def _client_data(n: int = 20, size: int = 8, classes: int = 3):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, size, size), generator=g, dtype=torch.uint8)
    y = torch.arange(n) % classes
    return x, y, np.zeros(n, dtype=np.int64)


def test_server_and_client_draw_the_same_coin_flips_and_canaries():
    req = AuditRequest(10, "random-pixels", seed=3)
    x, y, owners = _client_data()
    a, b = make_canaries(req, x, y, 3), make_canaries(req, x, y, 3)
    assert np.array_equal(a.included, req.included()) and torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert a.x.shape == (10, 8, 8) and a.x.dtype == torch.uint8 and int(a.y.max()) < 3
    assert not np.array_equal(req.included(), AuditRequest(10, "random-pixels", seed=4).included())
    x2, y2, o2 = a.insert(x, y, owners, cid=0)
    k = int(a.included.sum())
    assert len(y2) == len(y) + k == len(o2) and torch.equal(x2[: len(y)], x)  # own data kept, canaries appended
    assert torch.equal(x2[len(y):], a.x[torch.from_numpy(np.flatnonzero(a.included))])


def test_mislabelled_canaries_leave_the_client_set_and_come_back_with_a_wrong_label():
    req = AuditRequest(6, "mislabelled", seed=1)
    x, y, owners = _client_data()
    c = make_canaries(req, x, y, 3)
    assert len(c.drop) == 6 and torch.all(c.y != y[torch.from_numpy(c.drop)])
    x2, y2, _ = c.insert(x, y, owners, cid=2)
    assert len(y2) == len(y) - 6 + int(c.included.sum())
    with pytest.raises(ValueError, match="need a client with >= 22"):
        make_canaries(AuditRequest(11, "mislabelled", seed=1), x, y, 3)


def test_requests_and_runs_the_audit_cannot_observe_are_refused():
    with pytest.raises(ConfigError, match="at least 2 canaries"):
        AuditRequest(1, "random-pixels", 0)
    with pytest.raises(ConfigError, match="audit-canary"):
        AuditRequest(8, "dirac", 0)
    req = AuditRequest(8, "random-pixels", 0)
    with pytest.raises(ConfigError, match="only federated runs"):
        audit.check_auditable(SimpleNamespace(mode="centralized", num_clients=4), req)
    with pytest.raises(ConfigError, match="not among the 1 clients"):
        audit.check_auditable(SimpleNamespace(mode="federated", num_clients=1), AuditRequest(8, "random-pixels", 0, 3))
    # the run keys refuse the same before any work (flwr run path)
    with pytest.raises(ConfigError, match="us-audit-canaries: the audit needs at least 2 canaries"):
        _cfg(**{"us-audit-canaries": 1})
    with pytest.raises(ConfigError, match="only federated runs are audited"):
        _cfg(**{"us-audit-canaries": 8, "us-mode": "centralized"})
    with pytest.raises(ConfigError, match="us-audit-canary"):
        _cfg(**{"us-audit-canaries": 8, "us-audit-canary": "dirac"})


def test_audit_keys_leave_plain_runs_as_they_were_and_give_audited_runs_their_own_folder_and_hash():
    from flower_apps.common.results import run_hash, run_identity

    plain, audited = _cfg(), _cfg(**{"us-audit-canaries": 16})
    assert "audit_canaries" not in run_identity(plain) and "audit_canary" not in run_identity(plain)
    assert run_identity(audited)["audit_canaries"] == 16 and run_hash(plain) != run_hash(audited)
    assert audited.default_run_name == plain.default_run_name + "_audit-random-pixels-m16"
    assert AuditRequest.of(plain) is None and AuditRequest.of(audited) == AuditRequest(16, "random-pixels", plain.seed)
    assert audit.audit_records(plain) is None and audit.audit_records(audited).req == AuditRequest.of(audited)


def test_client_hook_only_touches_the_audited_client():
    x, y, owners = _client_data()
    cfg = _cfg(**{"us-audit-canaries": 4})
    can, x1, y1, _ = audit.client_hook(cfg, 1, x, y, owners, 3)
    assert can is None and x1 is x
    can, x0, _, _ = audit.client_hook(cfg, 0, x, y, owners, 3)
    assert can is not None and len(x0) == len(x) + int(can.included.sum())
    assert np.array_equal(can.included, AuditRequest.of(cfg).included())  # the server's coin flips
    can, x2, y2, o2 = audit.client_hook(_cfg(), 0, x, y, owners, 3)  # un-audited: untouched, same objects
    assert can is None and x2 is x and y2 is y and o2 is owners


class _Msg:
    """The parts of a flwr Message the grid view uses."""

    def __init__(self, content: RecordDict, reply_to: str = "") -> None:
        self.content = content
        self.metadata = SimpleNamespace(reply_to_message_id=reply_to)

    def has_content(self) -> bool:
        return True


class _FakeGrid:
    def __init__(self) -> None:
        self.pushed: list[_Msg] = []

    def push_messages(self, messages):
        self.pushed = list(messages)
        return [f"id{i}" for i in range(len(self.pushed))]

    def pull_messages(self, ids):
        out = []
        for i, msg in enumerate(self.pushed):
            content = RecordDict({"metrics": ConfigRecord({"x": 1})})
            if list(msg.content["config"]["client-ids"]) == [0]:  # the audited client answers with its record
                content[audit.AUDIT_RECORD] = audit.audit_record([2.0, 1.0], [1.5, 1.2])
            out.append(_Msg(content, reply_to=f"id{i}"))
        return out

    def get_node_ids(self):
        return [1, 2]


class _SpyStrategy(Strategy):
    """The wrapped strategy: sends the messages it built, records the replies it is handed."""

    def __init__(self, msgs) -> None:
        self.msgs, self.seen = msgs, []

    def summary(self) -> None:
        pass

    def configure_train(self, server_round, arrays, config, grid):
        return self.msgs

    def aggregate_train(self, server_round, replies):
        self.seen = list(replies)
        return None, None

    def configure_evaluate(self, server_round, arrays, config, grid):
        return []

    def aggregate_evaluate(self, server_round, replies):
        return None


def test_tap_collects_the_audited_clients_losses_and_hides_its_record_from_the_strategy():
    msgs = [_Msg(RecordDict({"config": ConfigRecord({"client-ids": [c], "run-config": "{}"})})) for c in (0, 1)]
    inner = _SpyStrategy(msgs)
    records = AuditRecords(AuditRequest(2, "random-pixels", 0))
    tap = AuditTap(inner, records)
    grid = _FakeGrid()
    sent = list(tap.configure_train(1, None, None, grid))  # delegated: the messages go out as the strategy built them
    assert sent == msgs and all(set(m.content["config"].keys()) == {"client-ids", "run-config"} for m in msgs)
    replies = grid.pull_messages(grid.push_messages(sent))
    assert sum(audit.AUDIT_RECORD in r.content for r in replies) == 1
    tap.aggregate_train(1, replies)
    assert inner.seen == replies and all(audit.AUDIT_RECORD not in r.content for r in inner.seen)  # plain replies
    assert records.rounds == [([2.0, 1.0], [1.5, 1.2])]
    assert list(tap.layers()) == [tap, inner] and tap.prepare_grid(grid) is grid  # the rest is the strategy's


def test_scores_per_threat_model_hand_computed():
    s = scores([([2.0, 1.0], [1.5, 1.2]), ([1.0, 1.0], [0.5, 1.1])])
    assert np.allclose(s["every-update"], [0.5 + 0.5, -0.2 - 0.1])
    assert np.allclose(s["last-update"], [-0.5, -1.1])
    with pytest.raises(RuntimeError, match="no canary losses"):
        scores([])


def test_sweep_audit_runs_the_smoke_pipeline_and_writes_the_numbers(tmp_path):
    # `sweep --audit` at its smallest: one DP-SGD FedAvg run (smoke preset, 1 round), through Flower's simulation.
    # --audit only sets the run key: the audit runs inside server_main / the ClientApp, as under `flwr run`.
    from flower_apps.ultrasound import sweep
    from flower_apps.ultrasound.report import write_report
    from flower_apps.ultrasound.server_app import is_complete, run_dir

    args = sweep.parse_args(["--grid", "smoke", "--methods", "fedavg", "--no-ablation", "--rounds", "1",
                             "--audit", "16", "--audit-canary", "random-pixels", "--results-dir", str(tmp_path)])
    (cfg,) = [c for c in sweep.build_configs(args) if c.dp_sgd]
    assert (cfg.audit_canaries, cfg.audit_canary) == (16, "random-pixels")
    assert cfg.default_run_name.endswith("_audit-random-pixels-m16")
    sweep._run([cfg], args)
    out = run_dir(cfg)
    assert out.name.endswith("_audit-random-pixels-m16") and is_complete(cfg)
    res = read_json(out / "audit.json")
    assert res["canaries"] == 16 and res["rounds_scored"] == 1 and res["eps_formal_rdp"] > 0
    for view in ("every-update", "last-update"):
        t = res["threat_models"][view]
        assert 0 <= t["eps_lower"] and 0 < t["guesses"] <= 16 and 0 <= t["correct"] <= t["guesses"]
        # a lower bound above the RDP epsilon would be a bug in DP-SGD or its accounting
        assert t["eps_lower"] <= res["eps_formal_rdp"]
    summary = read_json(out / "summary.json")
    assert summary["audit"] == res and res["eps_formal_rdp"] == summary["accounting"]["per_client"][0]["eps_rdp"]
    assert (out / "audit.md").is_file() and audit.is_audited(cfg)
    md = write_report(tmp_path)
    assert "eps audited >= (every-update)" in md and "Empirical DP-SGD audit" in md


def test_sweep_audit_defaults_to_gradient_canaries_for_dp_sgd_runs(tmp_path):
    # issue 37: the default --audit of a DP-SGD run is the one whose verdict can fire at CPU scale
    from flower_apps.ultrasound import sweep
    from flower_apps.ultrasound.gradient_audit import DEFAULT_GRADIENT_CANARIES

    args = sweep.parse_args(["--grid", "smoke", "--methods", "fedavg", "--no-ablation", "--audit",
                             "--results-dir", str(tmp_path)])
    by_dp = {c.dp_sgd: c for c in sweep.build_configs(args) if c.mode == "federated"}
    assert (by_dp[True].audit_canary, by_dp[True].audit_canaries) == ("gradient", DEFAULT_GRADIENT_CANARIES)
    assert (by_dp[False].audit_canary, by_dp[False].audit_canaries) == ("random-pixels", audit.DEFAULT_CANARIES)
    args = sweep.parse_args(["--grid", "smoke", "--methods", "fedavg", "--no-ablation", "--audit", "16",
                             "--audit-canary", "mislabelled", "--results-dir", str(tmp_path)])
    assert {(c.audit_canary, c.audit_canaries) for c in sweep.build_configs(args) if c.mode == "federated"} == \
        {("mislabelled", 16)}


def test_cli_refuses_a_bad_audit_before_running(capsys):
    from flower_apps.ultrasound.sweep import main

    assert main(["--grid", "smoke", "--methods", "fedavg", "--audit", "1", "--list"]) == 2
    assert "at least 2 canaries" in capsys.readouterr().err
