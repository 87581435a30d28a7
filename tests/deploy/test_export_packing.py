"""The export fits a preset's message packing to the sites (issue 41, item 1): three sites with the smoke preset
(5 clients per message, 2 messages) get clients-per-message=4, recorded in the run config the coordinator
repeats; a packing the user gave is never changed (refused with the reason), and a fitting one is kept."""

from __future__ import annotations

import pytest

from deploy.export import export


def test_three_sites_get_a_packing_that_gives_each_a_message(tmp_path, capsys):
    rec = export("dfl-dp", 3, 0, tmp_path, "smoke")
    assert rec["run_config"]["clients-per-message"] == 4 and rec["run_config"]["seed"] == 0
    assert [n["client_ids"] for n in rec["nodes"].values()] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert "clients-per-message=4" in capsys.readouterr().out


def test_a_given_packing_is_refused_not_changed(tmp_path):
    with pytest.raises(ValueError, match="3 nodes but only 2 messages of clients-per-message=5"):
        export("dfl-dp", 3, 0, tmp_path, "smoke", {"clients-per-message": 5})


def test_a_packing_that_fits_is_kept(tmp_path):
    rec = export("dfl-dp", 2, 0, tmp_path, "smoke")
    assert "clients-per-message" not in rec["run_config"]  # the preset's 5: two messages, one per node
