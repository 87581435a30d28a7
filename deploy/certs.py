"""TLS certificates and SuperNode authentication keys for a Flower 1.42 deployment.

What flwr 1.42 expects (read from the installed sources, see docs/deployment.md):

- SuperLink TLS: ``flower-superlink --ssl-ca-certfile ca.crt --ssl-certfile server.pem
  --ssl-keyfile server.key``. One HTTPS port serves the Fleet, Control and Runtime APIs, so
  the server certificate needs a SAN for every name clients use: the public DNS name / IP
  that SuperNodes and ``flwr`` dial, and 127.0.0.1 / localhost, which the SuperLink's own
  SuperExec uses to reach the Runtime API.
- SuperNodes and the ``flwr`` CLI verify it with the CA: ``--root-certificates ca.crt`` and
  ``root-certificates = "ca.crt"`` in the Flower config.
- SuperNode authentication: an EC key pair on a NIST curve (P-384 here). The private key in
  OpenSSH format (``flower-supernode --auth-supernode-private-key``, read with
  ``load_ssh_private_key``), the public key as an OpenSSH line
  (``ecdsa-sha2-nistp384 AAAA... name``) that the coordinator registers with
  ``flwr supernode register <key.pub> <connection>``. There is no authorized-keys CSV in 1.42
  (``--auth-list-public-keys`` is refused); ``authorized_supernodes.pub`` written here is the
  list the coordinator registers (``python -m deploy.flwr_cli register``).

    python -m deploy.certs tls --out certs --san flower.example.org --san 203.0.113.7   # the coordinator
    python -m deploy.certs node-key --out my-keys hospital-a      # each institution, privately
    python -m deploy.certs authorize --out certs hospital-a.pub hospital-b.pub   # the coordinator
    python -m deploy.certs all --out docker/certs --san superlink --supernodes 3  # rehearsal on one host only

Only ``node-key`` writes a SuperNode's private key where the SuperNode runs; the coordinator
holds the CA, the server key, the SuperExec secret and the sites' *public* keys. ``all`` writes
every site's private key too, on one host: a rehearsal (docker/compose.yaml's one-host
federation, the loopback tests), never a real deployment.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CURVE = ec.SECP384R1()  # flwr accepts any NIST curve for node keys; one curve for everything here
DEFAULT_SANS = ("localhost", "127.0.0.1", "::1")
AUTHORIZED_LIST = "authorized_supernodes.pub"
SUPEREXEC_SECRET = "superexec.secret"


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the CA and SuperLink server certificate."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKey:
    """One SuperNode's key pair on disk."""

    name: str
    private_key: Path
    public_key: Path


def _write(path: Path, data: bytes, private: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o600 if private else 0o644)
    tmp.replace(path)
    return path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"SAN must be a DNS name or an IP address, got {name!r}") from None
        return x509.DNSName(name)


def make_ca(common_name: str = "ppfl-studies Flower CA", days: int = 825,
            ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA that signs only the SuperLink's server certificate (path length 0)."""
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    key = ec.generate_private_key(CURVE)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA384())
    )
    return key, cert


def make_server_cert(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, names: list[str],
                     days: int = 825) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The SuperLink's certificate: serverAuth, one SAN per DNS name / IP address in ``names``.

    Strict verifiers (Python >= 3.13 sets VERIFY_X509_STRICT) need the key identifiers and a
    non-CA basic constraint, so both are set.
    """
    if not names:
        raise ValueError("the server certificate needs at least one subject alternative name")
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    sans = list(dict.fromkeys(names))  # keep order, drop duplicates
    key = ec.generate_private_key(CURVE)
    now = dt.datetime.now(dt.UTC)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, sans[0])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in sans]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                     crl_sign=False, content_commitment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    return key, cert


def make_node_keypair(name: str) -> tuple[bytes, bytes]:
    """(OpenSSH private key, OpenSSH public key line ending in ``name``) for one SuperNode."""
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"SuperNode name must be non-empty without spaces, got {name!r}")
    key = ec.generate_private_key(CURVE)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public + b" " + name.encode() + b"\n"


def write_tls(out: str | Path, names: list[str], days: int = 825) -> TlsFiles:
    """Write ca.crt/ca.key and server.pem/server.key (SANs: ``names`` plus loopback) under ``out``."""
    out = Path(out)
    _write(out / ".gitignore", b"# generated keys and certificates: never commit them\n*\n", private=False)
    ca_key, ca_cert = make_ca(days=days)
    srv_key, srv_cert = make_server_cert(ca_key, ca_cert, [*names, *DEFAULT_SANS], days)
    return TlsFiles(
        ca_cert=_write(out / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM), private=False),
        ca_key=_write(out / "ca.key", _pem_key(ca_key), private=True),
        server_cert=_write(out / "server.pem", srv_cert.public_bytes(serialization.Encoding.PEM), private=False),
        server_key=_write(out / "server.key", _pem_key(srv_key), private=True),
    )


def write_node_key(out: str | Path, name: str) -> NodeKey:
    """Write ``<name>.key`` (private, 0600) and ``<name>.pub`` under ``out``."""
    private, public = make_node_keypair(name)
    out = Path(out)
    return NodeKey(name, _write(out / f"{name}.key", private, private=True),
                   _write(out / f"{name}.pub", public, private=False))


def write_authorized_list(out: str | Path, keys: list[NodeKey]) -> Path:
    """``authorized_supernodes.pub``: one OpenSSH public key line per SuperNode to register."""
    text = b"".join(k.public_key.read_bytes() for k in keys)
    return _write(Path(out) / AUTHORIZED_LIST, text, private=False)


def write_superexec_secret(out: str | Path) -> Path:
    """``superexec.secret``: the shared secret of the SuperLink and its ServerApp SuperExec.

    With ``--isolation process`` the Runtime API that hands out ServerApp tasks listens on the
    SuperLink's public port; ``--superexec-auth-secret-file`` on both sides makes it refuse
    SuperExecs without the secret (flwr reads the file as raw bytes: no trailing newline).
    """
    return _write(Path(out) / SUPEREXEC_SECRET, secrets.token_hex(32).encode(), private=True)


def read_public_key_line(path: str | Path) -> bytes:
    """One site's OpenSSH public key line, checked as ``flwr supernode register`` will load it.

    Refuses, naming the file, anything that is not one ``ecdsa-sha2-nistp*`` public key line (above
    all a private key sent by mistake: it must never reach the coordinator).
    """
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key

    path = Path(path)
    data = path.read_bytes().strip()
    if b"PRIVATE KEY" in data:
        raise ValueError(f"{path}: this is a PRIVATE key; a site sends only its .pub file and keeps the key")
    lines = data.splitlines()
    if len(lines) != 1:
        raise ValueError(f"{path}: expected one OpenSSH public key line, got {len(lines)} lines")
    try:
        key = load_ssh_public_key(lines[0])
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: not an OpenSSH public key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError(f"{path}: SuperNode keys are EC keys on a NIST curve (ecdsa-sha2-nistp*), "
                         f"got {type(key).__name__}")
    return lines[0] + b"\n"


def write_authorized_from_files(out: str | Path, public_keys: list[str | Path]) -> Path:
    """``authorized_supernodes.pub`` from the public key files the sites sent (each checked first)."""
    if not public_keys:
        raise ValueError("no public key files given: each site runs `python -m deploy.certs node-key` and sends "
                         "its .pub")
    lines = [read_public_key_line(p) for p in public_keys]
    if len(set(lines)) != len(lines):
        raise ValueError("the same public key is listed twice")
    return _write(Path(out) / AUTHORIZED_LIST, b"".join(lines), private=False)


def write_all(out: str | Path, names: list[str], supernodes: int, days: int = 825) -> tuple[TlsFiles, list[NodeKey]]:
    """TLS files and the SuperExec secret under ``out``, ``supernodes`` key pairs under
    ``out/supernodes`` and the authorized list.

    Rehearsal only: every site's private key lands on this host (see the module docstring).
    """
    if supernodes < 0:
        raise ValueError(f"supernodes must be >= 0, got {supernodes}")
    tls = write_tls(out, names, days)
    write_superexec_secret(out)
    keys = [write_node_key(Path(out) / "supernodes", f"supernode-{i}") for i in range(1, supernodes + 1)]
    write_authorized_list(out, keys)
    return tls, keys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.certs", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for cmd in ("all", "tls"):
        s = sub.add_parser(cmd, help="CA + SuperLink certificate + SuperExec secret" + (
            " + every SuperNode's key pair (rehearsal on one host only)" if cmd == "all" else " (the coordinator)"))
        s.add_argument("--out", required=True, help="output directory")
        s.add_argument("--san", action="append", default=[],
                       help="DNS name or IP of the SuperLink as clients dial it (repeatable); "
                            f"{', '.join(DEFAULT_SANS)} are always added")
        s.add_argument("--days", type=int, default=825)
        if cmd == "all":
            s.add_argument("--supernodes", type=int, default=3, help="number of SuperNode key pairs")
    s = sub.add_parser("node-key", help="one SuperNode key pair (run by each institution)")
    s.add_argument("--out", required=True)
    s.add_argument("name")
    s = sub.add_parser("authorize", help="authorized_supernodes.pub from the sites' public key files")
    s.add_argument("--out", required=True, help="the coordinator's certificate directory")
    s.add_argument("public_keys", nargs="+", help="the .pub files the sites sent")
    args = p.parse_args(argv)
    if args.cmd == "authorize":
        try:
            listed = write_authorized_from_files(args.out, args.public_keys)
        except (OSError, ValueError) as exc:
            p.error(str(exc))
        print(f"authorized  {listed} ({len(args.public_keys)} SuperNodes; register with "
              "python -m deploy.flwr_cli register)")
        return 0
    if args.cmd == "node-key":
        k = write_node_key(args.out, args.name)
        print(f"private key {k.private_key} (keep it on the SuperNode)\npublic key  {k.public_key} "
              "(send it to the SuperLink operator to register)")
        return 0
    if args.cmd == "tls":
        tls = write_tls(args.out, args.san, args.days)
        write_superexec_secret(args.out)
        keys: list[NodeKey] = []
    else:
        tls, keys = write_all(args.out, args.san, args.supernodes, args.days)
    print(f"CA          {tls.ca_cert} (give to every SuperNode and flwr user)\n"
          f"server      {tls.server_cert} + {tls.server_key} (SuperLink only)\n"
          f"superexec   {Path(args.out) / SUPEREXEC_SECRET} (SuperLink and its ServerApp SuperExec only)")
    for k in keys:
        print(f"{k.name:11s} {k.private_key} + {k.public_key}")
    if keys:
        print(f"authorized  {Path(args.out) / AUTHORIZED_LIST} (register with python -m deploy.flwr_cli register)")
        print("REHEARSAL: every SuperNode's private key is on this host; in a real deployment each site runs "
              "`python -m deploy.certs node-key` and sends only its .pub")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
