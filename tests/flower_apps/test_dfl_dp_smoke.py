"""End to end: the smoke preset through Flower's real simulation path, then the report."""

import json

import pytest

from flower_apps.common.results import read_json, read_jsonl
from flower_apps.config import RUN_CONFIG_DEFAULTS


@pytest.mark.slow
def test_smoke_sweep_through_flower_simulation_writes_results_and_resumes(tmp_path, capsys):
    from flower_apps.dfl_dp import sweep

    rc = sweep.main(["--grid", "smoke", "--results-dir", str(tmp_path), "--attacks", "--attack-eps-cal", "2",
                     "--inversion-iters", "3", "--inversion-restarts", "1", "--attack-workers", "1"])
    assert rc == 0
    all_runs = sorted((tmp_path / "dfl-dp" / "runs").iterdir())
    shadows = [r for r in all_runs if r.name.endswith("_shadow")]
    runs = [r for r in all_runs if not r.name.endswith("_shadow")]
    assert len(shadows) == 4  # every attacked condition has a shadow model trained the same way
    assert all(read_json(s / "summary.json")["data_part"] == "shadow" for s in shadows)
    assert [r.name.split("_N")[0] for r in runs] == ["fl_C1_eps2", "fl_nodp", "sequential-dfl_C1_eps2",
                                                     "sequential-dfl_nodp"]
    for r in runs:
        summary = read_json(r / "summary.json")
        rounds = read_jsonl(r / "rounds.jsonl")
        assert len(rounds) == 2 and summary["num_rounds"] == 2
        assert all(0.0 <= x["test_acc"] <= 1.0 for x in rounds)
        assert all(x["num_contributors"] == 10 for x in rounds)
        assert (r / "class_counts.png").stat().st_size > 1000
        if summary["dp"]:
            assert summary["accounting"]["eps_total"] > 0
            assert summary["noise_mode"] == "secure" and summary["noise_seed_file"] is None
            assert all(x["sigma_abs"] == pytest.approx(summary["sigma_abs_nominal"]) for x in rounds)
    nodp = read_json(next(r for r in runs if r.name.startswith("fl_nodp")) / "summary.json")
    # training did something: the No-DP model beats chance on the held-out test set
    assert nodp["best_acc"] > 0.12
    out = tmp_path / "dfl-dp"
    for f in ("table3_utility.csv", "table3_utility.md", "table4_clipping_frequency.md", "retention_degradation.md",
              "figure6b_accuracy_vs_eps_cal.png", "figure4_retention.png", "figure5_degradation.png",
              "figure6a_accuracy_curves.png", "table5_membership_inference.md", "mia_auc.png",
              "figure7_inversion_vs_eps_cal.png", "table6_gradient_inversion.csv", "figure8_reconstructions.png"):
        assert (out / f).is_file(), f
    # attack phase: 3 victims captured per attacked run, 3 attacks each; MIA rows per feature x classifier
    import torch

    for r in runs:
        victims = torch.load(r / "victims.pt", weights_only=True)
        assert len(victims) == 3 and len({v["client"] for v in victims}) == 3
        assert all(0 <= v["index"] < 2000 and 0 <= v["label"] < 10 for v in victims)
        mia = read_json(r / "attacks_mia.json")
        assert len(mia) == 7 and all(0.0 <= m["auc"] <= 1.0 for m in mia)
        inv = read_json(r / "attacks_inversion_gradient.json")["rows"]
        assert sorted({x["attack"] for x in inv}) == ["dlg", "idlg", "invgrad"] and len(inv) == 9
    # resume: nothing left to do, the report is rebuilt from the finished runs
    capsys.readouterr()
    assert sweep.main(["--grid", "smoke", "--results-dir", str(tmp_path), "--attacks", "--attack-eps-cal", "2",
                       "--inversion-iters", "3", "--inversion-restarts", "1", "--attack-workers", "1"]) == 0
    assert "8 already done, 0 to run" in capsys.readouterr().out


@pytest.mark.slow
def test_smoke_preset_through_router_server_app(tmp_path):
    """The root router ServerApp/ClientApp (what `flwr run` uses), in-process."""
    from flower_apps.runner import run_config_in_process

    run_config_in_process({"preset": "smoke", "framework": "sequential-dfl", "dp": False, "num-rounds": 1,
                           "results-dir": str(tmp_path)})
    (run,) = (tmp_path / "dfl-dp" / "runs").iterdir()
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["framework"] == "sequential-dfl" and cfg["num_clients"] == 10
    assert read_json(run / "summary.json")["final_acc"] > 0
    assert set(RUN_CONFIG_DEFAULTS) >= {"framework", "clip-norm", "eps-cal"}


@pytest.mark.slow
def test_dp_runs_repeat_bit_for_bit_only_with_a_local_noise_seed_file(tmp_path):
    """Same run seed: secure noise differs between runs; a noise-seed-file makes two runs identical."""
    from flower_apps.dfl_dp.server_app import server_main
    from flower_apps.router import prepare
    from flower_apps.runner import run_many_in_process

    secret = tmp_path / "noise.seed"
    secret.write_text("a local secret")
    configs = [prepare({"preset": "smoke", "num-rounds": 1, "results-dir": str(tmp_path), "run-name": name,
                        "noise-seed-file": str(secret) if seeded else ""})[1]
               for name, seeded in (("seeded-a", True), ("seeded-b", True), ("secure-a", False), ("secure-b", False))]
    run_many_in_process(configs, server_main, num_supernodes=2)
    state = {}
    for cfg in configs:
        import torch

        state[cfg.run_name] = torch.load(tmp_path / "dfl-dp" / "runs" / cfg.run_name / "final_model.pt",
                                         weights_only=True)
    same = lambda a, b: all(torch.equal(state[a][k], state[b][k]) for k in state[a])
    assert same("seeded-a", "seeded-b")
    assert not same("secure-a", "secure-b")
    assert read_json(tmp_path / "dfl-dp" / "runs" / "seeded-a" / "summary.json")["noise_mode"] == "seeded"
