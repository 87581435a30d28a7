"""The sweep's grids (no training): run lists, presets and knobs, de-duplication."""

from __future__ import annotations

from collections import Counter

import pytest

from flower_apps.ultrasound.sweep import GRIDS, build_configs, main, parse_args


def test_smoke_grid_covers_every_method_dp_and_an_ablation():
    cfgs = build_configs(parse_args(["--grid", "smoke", "--results-dir", "/tmp/x"]))
    assert Counter(c.method for c in cfgs) == {"fedavg": 3, "fedprox": 1, "fedadam": 1, "centralized": 1, "local": 1}
    dp = sorted((c.max_grad_norm, c.noise_multiplier) for c in cfgs if c.dp_sgd)
    assert dp == [(0.5, 2.0), (1.5, 2.0)]  # the DP point is also an ablation cell: run once
    assert all(c.image_size == 32 and c.preset == "smoke" for c in cfgs)
    assert len({c.default_run_name for c in cfgs}) == len(cfgs)


def test_cpu_grid_size_and_knobs():
    args = parse_args(["--grid", "cpu", "--tasks", "normal-vs-abnormal", "--partitions", "iid", "--seeds", "2",
                       "--rounds", "3", "--no-ablation"])
    cfgs = build_configs(args)
    # per seed: 5 methods + 3 DP runs (FedAvg, FedProx, FedAdam at C = 1.5, z = 2)
    assert len(cfgs) == 2 * 8
    assert all(c.num_rounds == 3 and c.image_size == 160 and c.local_epochs == 3 for c in cfgs)
    assert {c.arch for c in cfgs} == {"efficientnet_lite0"} and all(c.pretrained for c in cfgs)
    # DP keeps the pretrained network: a DP linear probe from a zero head (the grid's recipe)
    assert {(c.dp_finetune, c.head_init, c.lr) for c in cfgs if c.dp_sgd} == {("frozen-bn-head", "zero", 0.01)}
    assert {(c.head_init, c.lr, c.channels_last) for c in cfgs if not c.dp_sgd} == {("timm", 1e-3, True)}
    three = build_configs(parse_args(["--grid", "cpu", "--partitions", "iid", "--seeds", "1", "--no-ablation"]))
    assert {c.task for c in three if c.dp_sgd} == {"normal-vs-abnormal", "benign-vs-malignant", "three-class"}
    assert {c.algorithm for c in cfgs if c.dp_sgd} == {"fedavg", "fedprox", "fedadam"}
    full = build_configs(parse_args(["--grid", "cpu", "--tasks", "normal-vs-abnormal", "--partitions", "non-iid",
                                     "--seeds", "1"]))
    assert sum(c.dp_sgd and c.method == "fedavg" for c in full) == len(GRIDS["cpu"].ablation_c) * len(
        GRIDS["cpu"].ablation_z)


def test_no_dp_means_no_dp_sgd_run_not_even_the_ablation():
    args = ["--grid", "cpu", "--tasks", "normal-vs-abnormal", "--partitions", "non-iid", "--seeds", "1"]
    assert any(c.dp_sgd for c in build_configs(parse_args(args + ["--no-ablation"])))  # the DP point
    no_dp = build_configs(parse_args(args + ["--no-dp"]))
    assert no_dp and not any(c.dp_sgd for c in no_dp)
    assert no_dp == build_configs(parse_args(args + ["--no-dp", "--no-ablation"]))


def test_paper_grid_uses_the_paper_preset_and_all_backbones():
    cfgs = build_configs(parse_args(["--grid", "paper", "--seeds", "1", "--no-ablation", "--no-dp"]))
    assert {c.arch for c in cfgs} == set(GRIDS["paper"].archs)
    assert all((c.image_size, c.num_rounds, c.local_epochs, c.num_clients) == (224, 100, 5, 8) for c in cfgs)
    assert len(cfgs) == 3 * 2 * 7 * 5


def test_cli_rejects_bad_knobs(capsys):
    assert main(["--grid", "smoke", "--archs", "resnet18", "--list"]) == 2
    assert "us-arch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--grid", "nope"])


def test_dp_set_changes_the_dp_runs_only_and_set_every_run():
    base = ["--grid", "cpu", "--tasks", "normal-vs-abnormal", "--partitions", "iid", "--seeds", "1", "--no-ablation",
            "--methods", "fedavg", "centralized", "--results-dir", "/tmp/x"]
    grid = build_configs(parse_args(base))
    # the paper's DP form instead of the grid's recipe, and T = 4 for every run
    paper = build_configs(parse_args(base + ["--dp-set", "us-dp-finetune=frozen-bn", "--dp-set", "us-head-init=timm",
                                             "--dp-set", "lr=0.001", "--set", "num-rounds=4"]))
    assert [c.dp_sgd for c in paper] == [c.dp_sgd for c in grid] == [False, False, True]
    for g, p in zip(grid, paper):
        assert p.num_rounds == 4 and g.num_rounds == 10
        if p.dp_sgd:
            assert (g.dp_finetune, g.head_init, g.lr) == ("frozen-bn-head", "zero", 0.01)
            assert (p.dp_finetune, p.head_init, p.lr) == ("frozen-bn", "timm", 0.001)
            assert g.default_run_name.endswith("_head-zero") and not p.default_run_name.endswith("_head-zero")
        else:  # the non-DP runs keep the preset's recipe and run folder name (only T differs)
            assert (p.dp_finetune, p.head_init, p.lr) == (g.dp_finetune, g.head_init, g.lr) == ("frozen-bn", "timm", 1e-3)
            assert p.default_run_name == g.default_run_name.replace("_T10_", "_T4_")
    # --set lr reaches every run, the DP runs included (it replaces the grid recipe's lr, not its other keys)
    every = build_configs(parse_args(base + ["--set", "lr=0.005"]))
    assert [(c.lr, c.head_init) for c in every] == [(0.005, "timm"), (0.005, "timm"), (0.005, "zero")]


@pytest.mark.parametrize("extra, message", [
    (["--dp-set", "us-noise-multiplier=1"], "--dp-set us-noise-multiplier: the grid sets this key"),
    (["--dp-set", "lr=0.1", "--dp-set", "lr=0.2"], "--dp-set: a key is given twice"),
    (["--set", "lr=0.1", "--dp-set", "lr=0.2"], "--dp-set lr: also given by --set"),
    (["--set", "us-task=three-class"], "--set us-task: this grid sets 'us-task' run by run"),
    (["--dp-set", "us-head-init=random"], "us-head-init"),
])
def test_bad_set_and_dp_set_are_refused_before_any_run(extra, message, capsys):
    assert main(["--grid", "smoke", "--list", *extra]) == 2
    assert message in capsys.readouterr().err


def test_dp_only_keeps_the_dp_runs_and_the_ablation(capsys):
    base = ["--grid", "smoke", "--results-dir", "/tmp/x"]
    every = build_configs(parse_args(base))
    dp = build_configs(parse_args(base + ["--dp-only"]))
    assert dp == [c for c in every if c.dp_sgd] and len(dp) == 2
    assert main(base + ["--dp-only", "--no-dp", "--list"]) == 2
    assert "--dp-only and --no-dp leave no run" in capsys.readouterr().err


def test_noise_seed_file_reaches_the_clients_environment_never_the_run_config(tmp_path, monkeypatch):
    """--noise-seed-file: the runs ask for seeded DP-SGD noise and the local clients read the file from
    their environment (the run key noise-seed-file is refused for ultrasound: the coordinator's)."""
    from flower_apps.ultrasound import sweep
    from flower_apps.ultrasound.study import NOISE_SEED_ENV

    seed = tmp_path / "seed"
    seed.write_bytes(b"0" * 32)
    monkeypatch.setenv(NOISE_SEED_ENV, "")  # so that teardown restores the variable main() sets
    monkeypatch.delenv(NOISE_SEED_ENV)
    args = parse_args(["--grid", "smoke", "--results-dir", str(tmp_path), "--noise-seed-file", str(seed)])
    cfgs = build_configs(args)
    assert cfgs and {c.noise_mode for c in cfgs} == {"seeded"} and {c.noise_seed_file for c in cfgs} == {""}
    monkeypatch.setattr(sweep, "sweep_main", lambda *a, **k: 0)
    assert sweep.main(["--grid", "smoke", "--results-dir", str(tmp_path), "--noise-seed-file", str(seed)]) == 0
    assert __import__("os").environ[NOISE_SEED_ENV] == str(seed.resolve())
    plain = build_configs(parse_args(["--grid", "smoke", "--results-dir", str(tmp_path)]))
    assert {c.noise_mode for c in plain} == {"secure"}
