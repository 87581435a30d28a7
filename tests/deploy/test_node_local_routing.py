"""Node-local data without processes: the describe query, error replies that name the node, placement.

The real root ClientApp (flower_apps.router: each message type to the study's handler) answers on a
fake grid (tests/conftest.py), each node with its own ``data-path`` in its node config, as a SuperNode
started with ``--node-config`` would.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, RecordDict

from datasets.base import DataError
from datasets.node_local import write_image_node
from flower_apps.common.node_data import NODE_DATA_ERROR, discover, node_data_path
from flower_apps.dfl_dp.config import ACTION
from flower_apps.dfl_dp.server_app import config_record_for
from flower_apps.router import client_app
from strategies.cohorts import build_messages, plan_cohorts


def _folder(root, clients, name):
    rng = np.random.default_rng(sum(clients))
    write_image_node(root, {c: (rng.integers(0, 255, (3 + c, 8, 8), dtype=np.uint8), np.arange(3 + c) % 10)
                            for c in clients}, num_classes=10, mean=(0.1307,), std=(0.3081,), node=name)
    return root


def _handler(paths):
    def handle(node_id, msg):
        cfg = {"data-path": str(paths[node_id])} if node_id in paths else {}
        return client_app(msg, Context(1, node_id, {**cfg, "node-name": f"site-{node_id}"}, RecordDict(), {}))
    return handle


@pytest.fixture
def cfg():
    from flower_apps.router import prepare

    return prepare({"study": "dfl-dp", "preset": "smoke", "num-clients": 6, "node-local-data": True,
                    "eval-data-path": "unused-here"})[1]


def test_describe_round_places_clients_and_records_the_malformed_node(tmp_path, cfg, fake_grid_cls):
    paths = {11: _folder(tmp_path / "a", [0, 1, 2], "site-a"), 22: _folder(tmp_path / "b", [3, 4, 5], "site-b"),
             33: tmp_path / "c"}
    (tmp_path / "c").mkdir()  # no node.json
    grid = fake_grid_cls([11, 22, 33], _handler(paths))
    found = discover(grid, ACTION, config_record_for(cfg), 10.0, cfg.num_clients)
    assert found.placement == {0: 11, 1: 11, 2: 11, 3: 22, 4: 22, 5: 22}
    assert found.sizes() == {c: 3 + c for c in range(6)}
    assert found.label_counts()[2] == [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert list(found.errors) == [33]
    assert found.errors[33].startswith("site-33") and "node.json: missing" in found.errors[33]
    summary = found.summary(range(8))
    assert summary["missing_clients"] == [6, 7]
    # each node by its own node-name (the operator's), not by the manifest's "node" field the export wrote
    assert [n["node"] for n in summary["nodes"]] == ["site-11", "site-22"]


def test_two_nodes_claiming_one_client_refuse_the_run(tmp_path, cfg, fake_grid_cls):
    paths = {1: _folder(tmp_path / "a", [0, 1], "site-a"), 2: _folder(tmp_path / "b", [1, 2], "site-b")}
    with pytest.raises(DataError, match=r"client 1 is held by two nodes: site-1 \(node id 1\) and site-2 \(node id 2\)"):
        discover(fake_grid_cls([1, 2], _handler(paths)), ACTION, config_record_for(cfg), 10.0, cfg.num_clients)
    paths = {1: _folder(tmp_path / "c", [7], "site-c")}
    with pytest.raises(DataError, match=r"site-1 \(node id 1\) holds client 7, outside \[0, num-clients=6\)"):
        discover(fake_grid_cls([1], _handler(paths)), ACTION, config_record_for(cfg), 10.0, cfg.num_clients)


def test_two_sites_given_one_folder_are_told_apart(tmp_path, cfg, fake_grid_cls):
    """The operator's mistake of issue 41: two SuperNodes with one exported folder (one manifest name, "node-0").
    The error names both sites by their node-name, so the misconfigured one can be found."""
    shared = _folder(tmp_path / "node-0", [0, 1], "node-0")
    with pytest.raises(DataError) as err:
        discover(fake_grid_cls([4, 7], _handler({4: shared, 7: shared})), ACTION, config_record_for(cfg), 10.0,
                 cfg.num_clients)
    assert "site-4 (node id 4) and site-7 (node id 7)" in str(err.value) and "node-0 and node-0" not in str(err.value)


def test_the_placement_addresses_each_message_to_the_holder():
    placement = {0: 9, 1: 9, 2: 5, 3: 5}
    assert plan_cohorts([0, 1, 2, 3], [5, 9], 2) == [(5, [0, 1]), (9, [2, 3])]  # round-robin: the wrong nodes
    assert plan_cohorts([0, 1, 2, 3], [5, 9], 2, placement) == [(9, [0, 1]), (5, [2, 3])]  # the holders
    # a message holds consecutive clients of one node: the order (a chain's) is kept, nothing spans two nodes
    assert plan_cohorts([0, 2, 1, 3], [5, 9], 2, placement) == [(9, [0]), (5, [2]), (9, [1]), (5, [3])]
    assert plan_cohorts([0, 1, 2, 3], [5, 9], 1, placement) == [(9, [0]), (9, [1]), (5, [2]), (5, [3])]
    with pytest.raises(ValueError, match=r"no node holds client\(s\) \[4\]"):
        plan_cohorts([0, 4], [5, 9], 1, placement)


@pytest.mark.parametrize("framework", ["fl", "sequential-dfl"])
def test_the_strategies_send_each_message_to_the_node_of_the_placement(fake_grid_cls, framework):
    from flwr.app import ConfigRecord

    from strategies.records import from_numpy
    from strategies.registry import build_strategy

    strategy = build_strategy(framework, [0, 1, 2, 3], "x", 2, placement={0: 9, 1: 9, 2: 5, 3: 5})
    grid = fake_grid_cls([5, 9, 11], lambda n, m: m)  # node 11 holds nothing: round-robin would use it
    msgs = list(strategy.configure_train(1, from_numpy({"w": np.zeros(2, np.float32)}), ConfigRecord(), grid))
    assert [(m.metadata.dst_node_id, list(m.content["config"]["client-ids"])) for m in msgs] == [(9, [0, 1]),
                                                                                                 (5, [2, 3])]


def test_a_framework_that_plans_no_logical_clients_refuses_a_placement():
    from strategies.base import PatternStrategy
    from strategies.registry import FRAMEWORKS, build_strategy, register_framework

    class NoPlan(PatternStrategy):  # plans its own messages (as Flower's node-sampling strategies do)
        def __init__(self, client_ids, action, clients_per_message=1):
            pass

        configure_train = aggregate_train = summary = None  # never called here

    register_framework("no-plan-test", NoPlan, None)
    try:
        assert isinstance(build_strategy("no-plan-test", [0], "x"), NoPlan)
        with pytest.raises(ValueError, match="does not plan messages over logical clients: no placement"):
            build_strategy("no-plan-test", [0], "x", placement={0: 1})
    finally:
        del FRAMEWORKS["no-plan-test"]


def test_a_node_asked_for_clients_it_does_not_hold_replies_with_an_error(tmp_path, cfg, fake_grid_cls):
    paths = {1: _folder(tmp_path / "a", [0, 1], "site-a")}
    grid = fake_grid_cls([1], _handler(paths))
    conf = config_record_for(cfg)
    conf["server-round"] = 1
    (msg,) = build_messages([(1, [4])], ArrayRecord(), conf, ACTION)
    reply = grid.send_and_receive([msg])[0]
    assert reply.has_error() and reply.error.code == NODE_DATA_ERROR
    assert reply.error.reason == "site-1: holds clients [0, 1], asked for [4]"


def test_node_data_path_refuses_mixed_modes(tmp_path):
    with_path = Context(1, 7, {"data-path": str(tmp_path), "node-name": "site-z"}, RecordDict(), {})
    without = Context(1, 7, {}, RecordDict(), {})
    assert node_data_path(with_path, True) == tmp_path and node_data_path(without, False) is None
    with pytest.raises(DataError, match="site-z: this SuperNode serves only its data-path"):
        node_data_path(with_path, False)
    with pytest.raises(DataError, match="node 7: the run sets node-local-data=true but this SuperNode has no data-"):
        node_data_path(without, True)


def test_the_coordinator_refuses_a_missing_eval_set(cfg):
    from dataclasses import replace

    from flower_apps.dfl_dp.data import eval_plan

    with pytest.raises(DataError, match="node-local-data=true needs eval-data-path"):
        eval_plan(replace(cfg, eval_data_path=""))
    with pytest.raises(DataError, match="coordinator eval-data-path unused-here: missing"):
        eval_plan(cfg)
    assert asdict(cfg)["node_local_data"] is True


def test_tabular_nodes_describe_their_tables_and_a_bad_csv_is_named(tmp_path, fake_grid_cls):
    from datasets.cancer import generate_cancer_table
    from datasets.node_local import write_table_node
    from flower_apps.router import prepare
    from flower_apps.tabular_pdp.config import ACTION as TAB_ACTION
    from flower_apps.tabular_pdp.phases import message_config

    df = generate_cancer_table().head(30)
    write_table_node(tmp_path / "a", {0: df.iloc[:12], 1: df.iloc[12:]}, node="country-a")
    write_table_node(tmp_path / "b", {2: df.drop(columns=["Obesity_Level"])}, node="country-b")
    paths = {1: tmp_path / "a", 2: tmp_path / "b"}

    def handle(node_id, msg):
        ctx = Context(1, node_id, {"data-path": str(paths[node_id]), "node-name": f"country-{'ab'[node_id - 1]}"},
                      RecordDict(), {})
        return client_app(msg, ctx)

    _, cfg = prepare({"study": "tabular-pdp", "preset": "smoke", "num-clients": 3, "node-local-data": True})
    found = discover(fake_grid_cls([1, 2], handle), TAB_ACTION, message_config(cfg), 10.0, 3)
    assert found.placement == {0: 1, 1: 1} and found.sizes() == {0: 12, 1: 18}
    assert found.errors[2].startswith("country-b")
    assert "client-2.csv: missing column(s) Obesity_Level" in found.errors[2]


def _failing_from(round_from: int, node: int, handle):
    """``handle``, except that ``node`` answers every message of server round >= ``round_from`` with its error."""
    from flower_apps.common.node_data import error_reply

    def wrapped(node_id, msg):
        cfg = msg.content["config"]
        if node_id == node and int(cfg.get("server-round", 0)) >= round_from and msg.metadata.message_type.startswith(
                "train."):
            return error_reply(msg, f"site-{node_id}", DataError("client-3.npz: not a readable .npz"))
        return handle(node_id, msg)
    return wrapped


@pytest.mark.parametrize("framework", ["fl", "sequential-dfl"])
def test_dfl_dp_node_failing_mid_run_is_named_in_the_summary_and_the_others_train_on(tmp_path, fake_grid_cls,
                                                                                  framework):
    from deploy.export import export
    from flower_apps.dfl_dp.server_app import server_main
    from flower_apps.router import prepare

    rec = export("dfl-dp", 2, 0, tmp_path / "data", "smoke", {"num-clients": 6})
    paths = {1: tmp_path / "data" / "node-0", 2: tmp_path / "data" / "node-1"}
    grid = fake_grid_cls([1, 2], _failing_from(2, 2, _handler(paths)))
    _, run_cfg = prepare({**rec["run_config"], "num-clients": 6, "framework": framework,
                          "results-dir": str(tmp_path / "out")})
    summary = server_main(grid, run_cfg)
    assert summary["node_errors"] == [] and summary["missing_clients"] == []
    errs = summary["round_errors"]
    assert {e["round"] for e in errs} == {2} and {e["node_id"] for e in errs} == {2}, errs
    assert all("site-2: client-3.npz: not a readable .npz" in e["error"] for e in errs), errs
    if framework == "fl":  # the reply checks name the logical clients the failed message asked for
        (on_node_2,) = [n["client_ids"] for n in summary["nodes"] if n["node_id"] == 2]
        assert sorted(c for e in errs for c in e["clients"]) == on_node_2, errs
    assert len(summary["acc_curve"]) == 2 and np.isfinite(summary["acc_curve"][-1])


def test_tabular_node_failing_mid_run_is_named_in_the_summary(tmp_path, fake_grid_cls):
    from deploy.export import export
    from flower_apps.router import prepare
    from flower_apps.tabular_pdp.server_app import server_main

    small = {"num-clients": 4, "num-rounds": 2, "tab-settings": "vanilla,pdp", "tab-levels": "2,1,0,0",
             "local-epochs": 1, "tab-drift-exclude": False}
    rec = export("tabular-pdp", 2, 0, tmp_path / "data", "smoke", small)
    paths = {1: tmp_path / "data" / "node-0", 2: tmp_path / "data" / "node-1"}

    def handle(node_id, msg):
        ctx = Context(1, node_id, {"data-path": str(paths[node_id]), "node-name": f"site-{node_id}"}, RecordDict(), {})
        return client_app(msg, ctx)

    sent = {"fit": 0}

    def flaky(node_id, msg):  # node 2 answers its first four fit messages, then fails
        from flower_apps.common.node_data import error_reply

        if node_id == 2 and msg.metadata.message_type == "train.tabular_pdp":
            sent["fit"] += 1
            if sent["fit"] > 4:
                return error_reply(msg, "site-2", DataError("client-3.csv: unreadable"))
        return handle(node_id, msg)

    _, run_cfg = prepare({**rec["run_config"], **small, "results-dir": str(tmp_path / "out")})
    summary = server_main(fake_grid_cls([1, 2], flaky), run_cfg)
    errs = summary["round_errors"]
    assert errs and {e["node_id"] for e in errs} == {2}, errs
    assert all("site-2: client-3.csv: unreadable" in e["error"] for e in errs), errs
    assert {c for e in errs for c in e["clients"]} <= {2, 3}
    assert all(e["error"].startswith(("vanilla: ", "pdp: ")) for e in errs), errs
    assert np.isfinite(summary["settings"]["pdp"]["final_mae"])


def test_a_run_refused_at_the_describe_round_leaves_no_folder(tmp_path, cfg, fake_grid_cls):
    """Issue 41, item 6: two nodes claiming one client stop the run before its first round, and the run folder
    that server_main had opened (config.json and a lock) is removed again; a folder that was there is kept."""
    from dataclasses import replace

    from datasets.base import DataError
    from flower_apps.common.results import discard_unstarted, open_run_folder
    from flower_apps.dfl_dp.server_app import run_dir, server_main

    ev = tmp_path / "eval.npz"
    np.savez(ev, x=np.zeros((4, 8, 8), np.uint8), y=np.arange(4) % 10, num_classes=10, mean=[0.1307], std=[0.3081])
    run = replace(cfg, eval_data_path=str(ev), results_dir=str(tmp_path / "results"))
    paths = {1: _folder(tmp_path / "a", [0, 1], "site-a"), 2: _folder(tmp_path / "b", [1, 2], "site-b")}
    with pytest.raises(DataError, match="client 1 is held by two nodes"):
        server_main(fake_grid_cls([1, 2], _handler(paths)), run)
    assert not run_dir(run).exists() and (tmp_path / "results").is_dir()
    # the detector's other side: a folder that existed before this process opened it is never removed
    kept = run_dir(run)
    kept.mkdir(parents=True)
    open_run_folder(kept, run)
    assert not discard_unstarted(kept) and (kept / "config.json").is_file()


def test_a_site_sees_its_own_data_error_in_its_log(tmp_path, cfg, caplog):
    """Issue 41, item 6: the node whose data-path is missing logs why, on the node (not only in the reply)."""
    import logging

    from flower_apps.common.node_data import NODE_DATA_ERROR

    handle = _handler({5: tmp_path / "no-such-folder"})
    msg = build_messages([(5, [0])], ArrayRecord(), config_record_for(cfg), ACTION, "query")[0]
    msg.content["config"]["query"] = "describe-node-data"
    with caplog.at_level(logging.ERROR, logger="flwr"):
        reply = handle(5, msg)
    assert reply.has_error() and reply.error.code == NODE_DATA_ERROR
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("site-5" in m and "no-such-folder" in m and "node-local data refused (query." in m for m in logged), logged
