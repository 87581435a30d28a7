"""``python -m deploy.flwr_cli connection`` keeps flwr's ``local`` connection the default (issue 41, items 5 and 9):
a plain ``flwr run .`` must still mean the local SuperLink after a federation or a Ray cluster was added."""

from __future__ import annotations

import tomllib

import pytest

from deploy import flwr_cli


def _read(home):
    return tomllib.loads((home / "config.toml").read_text())["superlink"]


def test_a_new_file_gets_flwr_s_local_entry_as_the_default(tmp_path, capsys):
    assert flwr_cli.main(["connection", "--flwr-home", str(tmp_path), "--name", "ray", "--address",
                          "127.0.0.1:39095", "--insecure"]) == 0
    links = _read(tmp_path)
    assert links["default"] == "local" and links["local"] == {"address": ":local:"}
    assert links["ray"] == {"address": "127.0.0.1:39095", "insecure": True}
    assert "default connection: 'local' (flwr run . ray ... targets it)" in capsys.readouterr().out


def test_flwr_s_own_default_file_keeps_its_entries(tmp_path):
    from flwr.cli.constant import DEFAULT_FLOWER_CONFIG_TOML  # what flwr writes on first use

    (tmp_path / "config.toml").write_text(DEFAULT_FLOWER_CONFIG_TOML)
    flwr_cli.write_connection(tmp_path, "mylink", "flower.example.org:8000", root_certificates=tmp_path / "ca.crt")
    links = _read(tmp_path)
    assert links["default"] == "local" and links["local"]["address"] == ":local:" and "supergrid" in links
    assert links["mylink"]["address"] == "flower.example.org:8000"
    assert tomllib.loads(DEFAULT_FLOWER_CONFIG_TOML)["superlink"]["local"] == flwr_cli.LOCAL_CONNECTION


def test_default_only_when_asked(tmp_path):
    flwr_cli.main(["connection", "--flwr-home", str(tmp_path), "--name", "compose", "--address", "127.0.0.1:8000",
                   "--insecure", "--default"])
    assert _read(tmp_path)["default"] == "compose"
    flwr_cli.write_connection(tmp_path, "ray", "127.0.0.1:39095", insecure=True)  # another one: default unchanged
    assert _read(tmp_path)["default"] == "compose"


def test_local_cannot_be_overwritten(tmp_path):
    with pytest.raises(ValueError, match="'local' is flwr's own connection"):
        flwr_cli.write_connection(tmp_path, "local", "127.0.0.1:9", insecure=True)
