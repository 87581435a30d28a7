"""TLS and SuperNode-auth material: what deploy/certs.py writes is what flwr 1.42 accepts.

The keys are checked with the very loaders flwr uses (``flower-supernode`` reads the
private key with ``load_ssh_private_key``, ``flwr supernode register`` validates the public
key with ``try_load_public_key``), the certificate with Python's TLS stack in both roles.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.cli.supernode.register import try_load_public_key
from flwr.supercore.primitives.asymmetric import public_key_to_bytes

from deploy import certs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    out = tmp_path_factory.mktemp("certs")
    tls, keys = certs.write_all(out, ["superlink", "flower.example.org", "203.0.113.7"], supernodes=2)
    return out, tls, keys


def test_server_certificate_names_every_address_and_chains_to_the_ca(material):
    _, tls, _ = material
    ca = x509.load_pem_x509_certificate(tls.ca_cert.read_bytes())
    srv = x509.load_pem_x509_certificate(tls.server_cert.read_bytes())
    san = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"superlink", "flower.example.org", "localhost"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {ipaddress.ip_address(a) for a in
                                                            ("203.0.113.7", "127.0.0.1", "::1")}
    srv.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not srv.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = srv.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in eku


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_tls_handshake_succeeds_with_the_ca_and_fails_without(material, host):
    """A real handshake on loopback: the client trusts only ca.crt and checks the hostname."""
    _, tls, _ = material
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tls.server_cert, tls.server_key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve(n: int) -> None:
        for _ in range(n):
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as s:
                    s.recv(1)
            except (ssl.SSLError, OSError):
                pass

    t = threading.Thread(target=serve, args=(2,), daemon=True)
    t.start()
    good = ssl.create_default_context(cafile=str(tls.ca_cert))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with good.wrap_socket(raw, server_hostname=host) as s:
            assert s.version() in ("TLSv1.2", "TLSv1.3")
            s.sendall(b"x")
    untrusting = ssl.create_default_context(cafile=str(_other_ca(material[0])))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            untrusting.wrap_socket(raw, server_hostname=host)
    t.join(timeout=10)
    listener.close()


def _other_ca(out: Path) -> Path:
    other = certs.write_tls(out / "other", ["superlink"])
    return other.ca_cert


def test_supernode_keys_load_like_flwr_loads_them(material):
    out, _, keys = material
    assert [k.name for k in keys] == ["supernode-1", "supernode-2"]
    listed = (out / certs.AUTHORIZED_LIST).read_text().splitlines()
    assert len(listed) == 2
    for key, line in zip(keys, listed):
        private = load_ssh_private_key(key.private_key.read_bytes(), None)  # flower-supernode
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        registered = try_load_public_key(key.public_key)  # flwr supernode register
        assert registered == public_key_to_bytes(private.public_key())
        assert line == key.public_key.read_text().strip() and line.endswith(f" {key.name}")
        assert line.startswith("ecdsa-sha2-nistp384 ")
    assert len({k.public_key.read_text() for k in keys}) == 2  # distinct keys


def test_private_files_are_owner_only_and_never_committed(material):
    out, tls, keys = material
    for path in (tls.ca_key, tls.server_key, out / certs.SUPEREXEC_SECRET, *(k.private_key for k in keys)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert "*" in (out / ".gitignore").read_text().split()
    secret = (out / certs.SUPEREXEC_SECRET).read_bytes()
    assert len(secret) == 64 and not secret.endswith(b"\n")  # flwr reads it as raw bytes


@pytest.mark.parametrize("bad", ["", "two words", "tab\there"])
def test_bad_names_are_refused(bad):
    with pytest.raises(ValueError):
        certs.make_node_keypair(bad)
    ca_key, ca = certs.make_ca()
    with pytest.raises(ValueError):
        certs.make_server_cert(ca_key, ca, [bad])


def _gen_certs(tmp_path, out, *args, **env):
    return subprocess.run(["bash", str(REPO / "docker" / "gen_certs.sh"), *args], cwd=tmp_path,
                          env={**os.environ, "PYTHON": sys.executable, "OUT": str(out), **env}, capture_output=True,
                          text=True, timeout=120)


def test_gen_certs_by_default_writes_only_what_the_coordinator_holds(tmp_path):
    """Issue 41, item 4: no SuperNode private key is made on the coordinator's host by default."""
    out = tmp_path / "certs"
    res = _gen_certs(tmp_path, out, "flower.example.org")
    assert res.returncode == 0, res.stdout + res.stderr
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert written == {".gitignore", "ca.crt", "ca.key", "server.pem", "server.key", certs.SUPEREXEC_SECRET}
    assert "deploy.certs node-key" in res.stdout and "deploy.certs authorize" in res.stdout
    srv = x509.load_pem_x509_certificate((out / "server.pem").read_bytes())
    names = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert {"superlink", "flower.example.org", "localhost"} <= set(names)
    again = _gen_certs(tmp_path, out)
    assert again.returncode != 0 and "already holds a CA" in again.stderr  # never silently replaced


@pytest.mark.parametrize("how", [("--rehearsal",), ("REHEARSAL=1",)])
def test_gen_certs_rehearsal_writes_the_compose_layout(tmp_path, how):
    out = tmp_path / "certs"
    args, env = ((), {"REHEARSAL": "1"}) if how == ("REHEARSAL=1",) else (how, {})
    res = _gen_certs(tmp_path, out, *args, "flower.example.org", SUPERNODES="3", **env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "REHEARSAL" in res.stdout and "private keys of all 3 SuperNodes" in res.stdout
    for name in ("ca.crt", "server.pem", "server.key", certs.SUPEREXEC_SECRET, certs.AUTHORIZED_LIST,
                 *(f"supernodes/supernode-{i}.{ext}" for i in (1, 2, 3) for ext in ("key", "pub"))):
        assert (out / name).is_file(), name


@pytest.mark.parametrize("args,env,message", [
    (("--insecure",), {}, "unknown option --insecure"),
    ((), {"REHEARSAL": "yes"}, "REHEARSAL must be 0 or 1"),
    (("--rehearsal",), {"SUPERNODES": "three"}, "SUPERNODES must be a number"),
])
def test_gen_certs_refuses_bad_input_before_writing(tmp_path, args, env, message):
    out = tmp_path / "certs"
    res = _gen_certs(tmp_path, out, *args, **env)
    assert res.returncode != 0 and message in res.stderr, res.stderr
    assert not out.exists()


def test_sites_make_their_keys_and_the_coordinator_authorizes_only_public_ones(tmp_path):
    """The real flow: each site runs `node-key`, sends its .pub; the coordinator runs `authorize`."""
    a = certs.write_node_key(tmp_path / "site-a", "hospital-a")
    b = certs.write_node_key(tmp_path / "site-b", "hospital-b")
    coord = tmp_path / "coordinator"
    assert certs.main(["tls", "--out", str(coord), "--san", "superlink"]) == 0
    assert not list(coord.rglob("*.key.pub")) and not (coord / "supernodes").exists()
    assert certs.main(["authorize", "--out", str(coord), str(a.public_key), str(b.public_key)]) == 0
    listed = (coord / certs.AUTHORIZED_LIST).read_text().splitlines()
    assert listed == [a.public_key.read_text().strip(), b.public_key.read_text().strip()]
    for line, key in zip(listed, (a, b)):
        pub = tmp_path / f"{key.name}.check.pub"
        pub.write_text(line + "\n")
        assert try_load_public_key(pub) == public_key_to_bytes(
            load_ssh_private_key(key.private_key.read_bytes(), None).public_key())  # as flwr registers it
    # no private key anywhere on the coordinator's side
    assert all(b"PRIVATE KEY" not in p.read_bytes() for p in coord.rglob("*")
               if p.is_file() and p.name not in ("ca.key", "server.key"))


def test_authorize_refuses_a_private_key_and_garbage(tmp_path, capsys):
    k = certs.write_node_key(tmp_path, "hospital-a")
    with pytest.raises(ValueError, match="PRIVATE key"):
        certs.write_authorized_from_files(tmp_path / "out", [k.private_key])
    junk = tmp_path / "junk.pub"
    junk.write_text("ssh-ed25519 notbase64 x\n")
    with pytest.raises(ValueError, match="not an OpenSSH public key"):
        certs.write_authorized_from_files(tmp_path / "out", [junk])
    with pytest.raises(ValueError, match="listed twice"):
        certs.write_authorized_from_files(tmp_path / "out", [k.public_key, k.public_key])
    with pytest.raises(SystemExit):
        certs.main(["authorize", "--out", str(tmp_path / "out"), str(k.private_key)])
    assert "PRIVATE key" in capsys.readouterr().err
    assert not (tmp_path / "out" / certs.AUTHORIZED_LIST).exists()


def test_flower_env_puts_this_pythons_bin_first_on_path(monkeypatch, tmp_path):
    """Flower spawns flower-superexec / flwr-serverapp by bare name: an unactivated venv must still work."""
    from deploy import flwr_cli

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = flwr_cli.flower_env(tmp_path)
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert flwr_cli.flower_env(tmp_path, {"PATH": env["PATH"]})["PATH"] == env["PATH"]  # not added twice
