"""A node-local run whose config differs from its export is refused, naming the keys (issue 41, item 1)."""

from __future__ import annotations

import pytest

from deploy.export import export
from flower_apps.errors import ConfigError
from flower_apps.router import check_export_config, prepare


def _cfg(keys):
    return prepare(keys, given=keys)


def test_a_run_missing_the_exported_keys_is_refused_with_the_values_to_pass(tmp_path):
    rec = export("dfl-dp", 3, 1, tmp_path / "rehearsal", "smoke", {"clients-per-message": 2})
    assert [n["client_ids"] for n in rec["nodes"].values()] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    eval_path = rec["run_config"]["eval-data-path"]
    # what the docs' step 6 used to say: study, preset, node-local keys, nothing else
    spec, cfg = _cfg({"study": "dfl-dp", "preset": "smoke", "node-local-data": True, "eval-data-path": eval_path})
    with pytest.raises(ConfigError) as err:
        check_export_config(spec, cfg)
    msg = str(err.value)
    assert "export.json" in msg and "seed is 0, exported with 1" in msg
    assert "clients-per-message is 5, exported with 2" in msg
    assert '--run-config "seed=1 clients-per-message=2"' in msg
    # the exported line itself passes; so does a run that adds results-dir
    spec, cfg = _cfg({**rec["run_config"], "results-dir": str(tmp_path / "results")})
    check_export_config(spec, cfg)
    # a simulation (no node-local data) or an eval set outside an export folder is not checked
    spec, cfg = _cfg({"study": "dfl-dp", "preset": "smoke"})
    check_export_config(spec, cfg)


def test_launch_refuses_it_before_flwr_run(tmp_path):
    from deploy.launch import check_run_config

    rec = export("dfl-dp", 3, 0, tmp_path / "rehearsal", "smoke", {"clients-per-message": 2})
    line = f"study='dfl-dp' preset='smoke' node-local-data=true eval-data-path='{rec['run_config']['eval-data-path']}'"
    with pytest.raises(ConfigError, match=r'pass --run-config "clients-per-message=2"'):
        check_run_config([line])
    check_run_config([line + " clients-per-message=2"])


def test_run_config_in_process_refuses_it_before_ray_starts(tmp_path, monkeypatch):
    import flower_apps.runner as runner

    rec = export("dfl-dp", 3, 0, tmp_path / "rehearsal", "smoke", {"clients-per-message": 2})
    monkeypatch.setattr(runner, "simulate", lambda *a, **k: pytest.fail("Ray started"))
    with pytest.raises(ConfigError, match="clients-per-message is 5, exported with 2"):
        runner.run_config_in_process({"study": "dfl-dp", "preset": "smoke", "node-local-data": True,
                                      "eval-data-path": rec["run_config"]["eval-data-path"],
                                      "results-dir": str(tmp_path / "results")})
    assert not (tmp_path / "results").exists()
