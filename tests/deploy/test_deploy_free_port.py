"""deploy.processes.free_port never hands out a port twice in one process (a Ray node takes ~20 at once)."""

from __future__ import annotations

import socket

import pytest

from deploy import processes


class _ScriptedSocket:
    """A socket whose bind(0) gets the next port of a script (the OS offering a just-closed port again)."""

    script: list[int] = []

    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def bind(self, addr):
        self.port = _ScriptedSocket.script.pop(0)

    def getsockname(self):
        return ("127.0.0.1", self.port)


def test_a_port_offered_again_is_skipped(monkeypatch):
    monkeypatch.setattr(processes, "_HANDED_OUT", set())
    monkeypatch.setattr(processes.socket, "socket", _ScriptedSocket)
    _ScriptedSocket.script = [40001, 40001, 40002, 40001, 40002, 40003]
    assert [processes.free_port() for _ in range(3)] == [40001, 40002, 40003]
    _ScriptedSocket.script = [40001] * 1000
    with pytest.raises(RuntimeError, match="has not handed out"):
        processes.free_port()


def test_real_ports_are_distinct_and_bindable():
    ports = [processes.free_port() for _ in range(64)]
    assert len(set(ports)) == 64
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[-1]))
