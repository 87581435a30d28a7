"""Issue 17 sweep additions: --dataset, the graph-degree (topology) experiment, the theory table."""

from __future__ import annotations

from pathlib import Path

import pytest

from datasets.sources import DataError
from flower_apps.unlinkable_dfl import sweep
from flower_apps.unlinkable_dfl.netexp import TrafficSpec, measure
from flower_apps.unlinkable_dfl.report import write_report

FASHION = Path("/usr/share/datasets/fashion-mnist")


def test_topology_experiment_sweeps_the_graph_degree(tmp_path):
    p = sweep.plan("topology", "reduced")
    degrees = sorted(r["udfl-degree"] for r in p.runs if "udfl-degree" in r)
    assert degrees == [2, 4, 8] and any(r.get("udfl-topology") == "full-mesh" for r in p.runs)
    assert sorted(s.degree for s in p.traffic) == [2, 4, 8]
    configs = sweep.build_configs(p.runs, "reduced", range(1), str(tmp_path))
    assert sorted((c.topology, c.degree) for c in configs)[:3] == [("circulant", 2), ("circulant", 4), ("circulant", 8)]
    assert {c.num_nodes for c in configs} == {16}


@pytest.mark.parametrize("experiment", sweep.DATASET_EXPERIMENTS)
def test_dataset_knob_reaches_every_learning_run(experiment, tmp_path):
    runs = sweep.plan(experiment, "reduced").runs
    configs = sweep.build_configs(runs, "reduced", range(1), str(tmp_path), {"dataset": "fashion-mnist"})
    assert configs and {c.dataset for c in configs} == {"fashion-mnist"}
    default = sweep.build_configs(runs, "reduced", range(1), str(tmp_path))
    assert {c.dataset for c in default} == {"mnist-5k"}  # the reduced preset's dataset when --dataset is not given


def test_dataset_is_refused_where_it_does_not_apply_before_any_run(tmp_path, capsys):
    with pytest.raises(ValueError, match="--dataset applies to the experiments"):
        sweep.check_dataset("linking", "fashion-mnist", None)
    with pytest.raises(ValueError, match="--data-dir needs --dataset"):
        sweep.check_dataset("scaling", None, str(tmp_path))
    assert sweep.main(["--experiment", "churn", "--dataset", "fashion-mnist", "--results-dir", str(tmp_path)]) == 2
    assert "--dataset applies" in capsys.readouterr().err
    assert not (tmp_path / "unlinkable-dfl").exists()  # nothing ran


def test_missing_cifar10_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="(?i)cifar"):
        sweep.check_dataset("scaling", "cifar10", str(tmp_path / "no-cifar-here"))


@pytest.mark.skipif(not FASHION.is_dir(), reason=f"offline Fashion-MNIST not installed at {FASHION}")
def test_offline_fashion_mnist_loads_for_the_sweep():
    sweep.check_dataset("payload", "fashion-mnist", None)  # raises if the IDX files are unusable


def _theory_rows(out: Path) -> list[dict]:
    import csv

    with open(out / "linking-reduced" / "table_linking_theory.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_theory_table_flags_a_measured_advantage_above_its_bound(tmp_path):
    row = measure(TrafficSpec(num_nodes=6, fragments_per_peer=2, max_hops=2, outbox=5), entropy_relays=2)
    assert row["agnostic_advantage"] <= row["agnostic_trace_bound"]
    md = write_report("linking", "reduced", [], [row], tmp_path)
    # honest labels (issue 39): our bound under its own name, the paper's Theorem 1 not claimed
    assert "chain bound (ours)" in md and "multiplicity gamma_T" in md and "Theorem 1 /" not in md
    (got,) = _theory_rows(tmp_path)
    assert got["agnostic: within chain bound"] == got["aware: within chain bound"] == "yes"
    assert (tmp_path / "linking-reduced" / "figure_linking_theory.png").is_file()
    bad = {**row, "aware_advantage": row["aware_trace_bound"] + 0.01}  # a violation must show
    write_report("linking", "reduced", [], [bad], tmp_path)
    assert _theory_rows(tmp_path)[0]["aware: within chain bound"] == "**NO**"
    over = {**row, "agnostic_trace_mult_bound": row["agnostic_advantage"] - 0.01}  # and one of the multiplicity form
    write_report("linking", "reduced", [], [over], tmp_path)
    assert _theory_rows(tmp_path)[0]["agnostic: within multiplicity"] == "**NO**"


@pytest.mark.parametrize("scale", sweep.SCALES)
def test_scaling_and_linking_measure_the_linking_of_the_learning_configurations(scale, tmp_path):
    """The report card joins a learning run with the transport measurement of its own configuration
    (unlinkable_dfl.card.transport_key): the scaling experiment measures each of its fragment transports, and the
    linking experiment includes the scale's learning preset (its O), not only the O grid."""
    from flower_apps.unlinkable_dfl.card import transport_key
    from flower_apps.unlinkable_dfl.models import build_model, shareable_keys
    from flower_apps.unlinkable_dfl.node import fragment_layout

    def key_of_spec(t):
        return transport_key(mixnet=t.mixnet, num_nodes=t.num_nodes, topology=t.topology, degree=t.degree,
                             max_hops=t.max_hops, outbox=t.outbox, mu=t.mu, cover=t.cover,
                             fragments=t.fragments_per_peer)

    model = build_model("lenet5", 0)
    values = sum(model.state_dict()[k].numel() for k in shareable_keys(model))
    p = sweep.plan("scaling", scale)
    measured = {key_of_spec(t) for t in p.traffic}
    learning = [c for c in sweep.build_configs(p.runs, scale, range(1), str(tmp_path)) if c.mode == "unlinkable"]
    assert learning and {c.transport for c in learning} == {"mixnet", "direct"}
    for c in learning:
        frags = fragment_layout(values, c.payload_size, c.encoding).count
        key = transport_key(mixnet=c.transport == "mixnet", num_nodes=c.num_nodes, topology=c.topology,
                            degree=c.degree, max_hops=c.max_hops, outbox=c.outbox, mu=c.mu, cover=c.cover,
                            fragments=frags)
        assert key in measured, (c.transport, c.num_nodes, c.outbox, frags)
    assert any(t.outbox == sweep.learning_outbox(scale) and t.max_hops == 2 for t in sweep.plan("linking", scale).traffic)
