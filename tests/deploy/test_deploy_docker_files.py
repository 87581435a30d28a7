"""docker/: the compose file and Dockerfiles, checked without a Docker engine.

What is checked without Docker: every flag in the compose commands exists in the installed CLI's
``--help`` (``flower-superlink``, ``flower-supernode``, ``flower-superexec``, and
``python -m deploy.flwr_cli``) with a legal value; the wiring (ports, addresses, TLS files,
keys, the SuperExec secret, node configs) is consistent; every file a command names is
mounted and is one that docker/gen_certs.sh writes; the Dockerfiles' entry points are
Flower commands, their flwr pin is the project's, they build offline (``BASE_IMAGE`` build
argument, no ``# syntax=`` pull, wheels only from the bind-mounted wheelhouse whose list is the
project's), and their ignore files admit exactly what they use. The SuperLink's one port (Fleet,
Control and Runtime API in flwr 1.42; the Control API has no account authentication) is published
on the host's loopback only. ``docker compose config`` runs where Docker Compose exists and
PPFL_DOCKER_TESTS=1 opts in; the images are built and the federation run for real by
scripts/docker_federation.sh (tests/deploy/test_docker_federation.py, same opt-in). The same flags
run without Docker in test_deploy_federation.py.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from functools import cache
from pathlib import Path

import flwr
import pytest
import yaml
from flwr.common.config import parse_config_args

from deploy import certs, flwr_cli

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]


# ---------------------------------------------------------------------------- parsing helpers
def dockerfile_stages(path: Path) -> dict[str, dict]:
    """{stage name: {'entrypoint': [...], 'copy': [...], 'args': {...}, 'run': [...]}}; stages
    inherit ENTRYPOINT from the stage they are built FROM."""
    text = re.sub(r"\\\n", " ", path.read_text())
    stages: dict[str, dict] = {}
    cur: dict | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, rest = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            parts = rest.split()
            base = stages.get(parts[0], {})
            name = parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else f"stage{len(stages)}"
            cur = stages[name] = {"entrypoint": base.get("entrypoint"), "copy": list(base.get("copy", [])),
                                  "args": dict(base.get("args", {})), "run": []}
        elif cur is None:
            continue  # global ARGs before the first FROM
        elif instr == "ENTRYPOINT":
            cur["entrypoint"] = json.loads(rest)
        elif instr == "COPY":
            cur["copy"].append(rest.split()[:-1])
        elif instr == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            cur["args"][k] = v
        elif instr == "RUN":
            cur["run"].append(rest)
    return stages


@cache
def help_text(exe: str) -> str:
    with tempfile.TemporaryDirectory() as home:  # the daemons create FLWR_HOME on start-up
        res = subprocess.run([flwr_cli.executable(exe), "--help"], capture_output=True, text=True, timeout=120,
                             env=flwr_cli.flower_env(home, {"HOME": home}))
    assert res.returncode == 0, res.stderr
    return res.stdout


def cli_flags(exe: str) -> tuple[set[str], dict[str, set[str]]]:
    """(every --flag in ``exe --help``, {flag: allowed values} for flags with {a,b} choices)."""
    text = help_text(exe)
    flags = set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", text))
    choices = {f: set(c.split(",")) for f, c in re.findall(r"(--[a-z0-9-]+) \{([^}]+)\}", text)}
    return flags, choices


def split_command(command: list[str]) -> dict[str, str | None]:
    """['--a=1', '--b'] -> {'--a': '1', '--b': None} (compose commands use the --flag=value form)."""
    out: dict[str, str | None] = {}
    for item in command:
        assert item.startswith("--"), f"positional or split argument {item!r}: use --flag=value"
        flag, eq, value = item.partition("=")
        assert flag not in out, f"{flag} given twice"
        out[flag] = value if eq else None
    return out


def service_executable(name: str) -> str:
    build = SERVICES[name]["build"]
    assert build["context"] == "..", "build contexts are the repository root"
    stages = dockerfile_stages(REPO / build["dockerfile"])
    stage = stages[build["target"]] if "target" in build else list(stages.values())[-1]
    return stage["entrypoint"][0]


def mounts(name: str) -> dict[str, str]:
    """{container path: host path (relative to docker/)} of a service's bind mounts."""
    out = {}
    for v in SERVICES[name].get("volumes", []):
        host, container = v.split(":")[:2]
        out[container] = host
    return out


def published_ports(service: dict) -> list[tuple[str | None, str, str]]:
    """(host ip or None for every interface, host port, container port) of each ``ports`` entry, in
    Compose's short syntax ``[HOST_IP:][HOST_PORT:]CONTAINER_PORT[/PROTOCOL]`` (IPv6 host ips in
    brackets) or its long syntax ``{target, published, host_ip}``."""
    out = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            out.append((entry.get("host_ip"), str(entry.get("published", "")), str(entry["target"])))
            continue
        spec = str(entry).split("/")[0]
        host_ip = None
        if spec.startswith("["):  # [::1]:8000:8000
            host_ip, _, spec = spec[1:].partition("]:")
        parts = spec.split(":")
        if len(parts) == 3:
            host_ip, parts = parts[0], parts[1:]
        host, container = (parts[0], parts[1]) if len(parts) == 2 else ("", parts[0])  # "8000": random host port
        out.append((host_ip or None, host, container))
    return out


def _is_loopback(host_ip: str | None) -> bool:
    if host_ip is None:
        return False  # Compose publishes on every interface
    if host_ip == "localhost":
        return True
    try:
        return ipaddress.ip_address(host_ip).is_loopback
    except ValueError:
        return False


def control_api_exposed(compose: dict) -> list[str]:
    """Every way ``compose`` makes a SuperLink's HTTP port (which serves the Control API) reachable
    from beyond the host's loopback: a published port without a loopback host ip, or host networking."""
    bad = []
    for name, svc in compose["services"].items():
        if "superlink.Dockerfile" not in str(svc.get("build", {}).get("dockerfile", "")):
            continue
        args = split_command(svc["command"])
        port = args.get("--port") or "8000"  # flower-superlink's default
        if svc.get("network_mode") == "host":
            bad.append(f"{name}: network_mode host puts --port {port} on every interface")
        for host_ip, host, container in published_ports(svc):
            if container == port and not _is_loopback(host_ip):
                bad.append(f"{name}: {host_ip or '*'}:{host or '(random)'} -> {container}")
    return bad


def flower_services() -> list[str]:
    return [n for n, s in SERVICES.items() if "entrypoint" not in s]


SUPERNODES = sorted(n for n in SERVICES if n.startswith("supernode-"))


# ---------------------------------------------------------------------------- Dockerfiles
def test_dockerfile_entrypoints_are_installed_flower_commands():
    seen = set()
    for df in ("superlink.Dockerfile", "app.Dockerfile"):
        for name, stage in dockerfile_stages(DOCKER / df).items():
            if stage["entrypoint"]:
                exe = stage["entrypoint"][0]
                assert exe in ("flower-superlink", "flower-supernode", "flower-superexec"), (df, name, exe)
                assert Path(flwr_cli.executable(exe)).exists()
                seen.add(exe)
    assert seen == {"flower-superlink", "flower-supernode", "flower-superexec"}


def test_flwr_pin_matches_the_project():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(re.search(r"==([\w.]+)", d).group(1) for d in deps if d.startswith("flwr"))
    stages = dockerfile_stages(DOCKER / "superlink.Dockerfile")
    assert {s["args"].get("FLWR_VERSION") for s in stages.values()} == {pin}
    assert flwr.__version__ == pin


def _bind_sources(stage: dict) -> list[str]:
    """The build-context paths a stage's ``RUN --mount=type=bind,source=...`` mounts."""
    return [m for r in stage["run"] for m in re.findall(r"--mount=type=bind,source=([^,\s]+)", r)]


@pytest.mark.parametrize("dockerfile", ["superlink.Dockerfile", "app.Dockerfile"])
def test_dockerfiles_build_offline_from_a_base_image_argument(dockerfile):
    text = (DOCKER / dockerfile).read_text()
    # A `# syntax=` line makes BuildKit pull its frontend from Docker Hub: no offline build.
    assert not re.search(r"^#\s*syntax=", text, re.M)
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M)  # Docker Hub users keep the official image
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    stages = dockerfile_stages(DOCKER / dockerfile)
    assert froms[0] == "${BASE_IMAGE}" and all(f == "${BASE_IMAGE}" or f in stages for f in froms), froms
    installs = [r for st in stages.values() for r in st["run"] if "pip install" in r]
    assert installs, "no install step"
    for run in installs:
        # every wheel from the host's wheelhouse, bind-mounted for the step (no layer of wheels)
        assert "--mount=type=bind,source=docker/wheelhouse,target=/wheelhouse" in run
        assert run.count("pip install") == run.count("--no-index --find-links /wheelhouse"), run
        assert "-c /wheelhouse/constraints.txt" in run  # the host environment's versions
        # one venv path for Debian's /usr/bin/python3 and python:3.11-slim's /usr/local/bin/python
        assert "python3 -m venv /opt/venv" in run and " pip install" not in run.replace("/opt/venv/bin/pip install", "")
    assert re.search(r"^ENV PATH=/opt/venv/bin:\$PATH$", text, re.M)


def test_app_image_installs_the_project_dependencies_and_the_nodeps_pair():
    (run,) = [r for r in dockerfile_stages(DOCKER / "app.Dockerfile")["deps"]["run"] if "pip install" in r]
    assert "-r /wheelhouse/requirements.txt" in run
    assert "--no-deps -r /wheelhouse/requirements-nodeps.txt" in re.sub(r"\s+", " ", run)


def test_wheelhouse_lists_the_project_dependencies(tmp_path):
    """docker/make_wheelhouse.sh's list is pyproject.toml's dependencies plus the lite0 extra (its Python
    step run here as the script runs it, without the pip download)."""
    script = (DOCKER / "make_wheelhouse.sh").read_text()
    code = script[script.index("<<'PY'\n") + len("<<'PY'\n"):script.index("\nPY\n")]
    res = subprocess.run([sys.executable, "-", str(tmp_path)], input=code, cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = (tmp_path / "requirements.txt").read_text().splitlines()
    assert listed == project["dependencies"] + project["optional-dependencies"]["lite0"]
    assert [r for r in listed if re.match(r"^(torch|torchvision)==", r)], "torch pins come from the project"
    assert "cp requirements-nodeps.txt" in script and "pip freeze --exclude-editable" in script
    assert "docker/wheelhouse/" in (REPO / ".gitignore").read_text().splitlines() or \
        "/docker/wheelhouse/" in (REPO / ".gitignore").read_text().splitlines()


def _ignore_lines(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


@pytest.mark.parametrize("dockerfile", ["superlink.Dockerfile", "app.Dockerfile"])
def test_dockerignore_admits_what_is_copied_and_no_keys(dockerfile):
    ignore = _ignore_lines(DOCKER / f"{dockerfile}.dockerignore")
    assert ignore[0] == "**"  # deny by default, then admit
    for stage in dockerfile_stages(DOCKER / dockerfile).values():
        for sources in stage["copy"]:
            for src in sources:
                assert (REPO / src).exists(), src
                assert f"!{src}" in ignore, f"{src} is copied but excluded from the build context"
        for src in _bind_sources(stage):
            assert f"!{src.rstrip('/')}/" in ignore, f"{src} is bind-mounted but excluded from the build context"
    # docker/certs never enters a build: of docker/, only the wheelhouse is admitted
    assert [p for p in ignore if p.startswith("!docker")] == ["!docker/wheelhouse/"]
    # Engines whose BuildKit reads only the context's .dockerignore (Docker 20.10) get the same list.
    assert _ignore_lines(REPO / ".dockerignore") == ignore


# ---------------------------------------------------------------------------- compose commands
@pytest.mark.parametrize("service", flower_services())
def test_compose_flags_exist_in_the_real_cli(service):
    exe = service_executable(service)
    flags, choices = cli_flags(exe)
    args = split_command(SERVICES[service]["command"])
    for flag, value in args.items():
        assert flag in flags, f"{service}: `{exe}` has no {flag} (see `{exe} --help`)"
        if flag in choices:
            assert value in choices[flag], f"{service}: {flag}={value} not in {choices[flag]}"
    assert "--insecure" not in args  # TLS everywhere


def test_superlink_runs_tls_auth_and_process_isolation():
    args = split_command(SERVICES["superlink"]["command"])
    assert {"--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile", "--enable-supernode-auth"} <= set(args)
    assert args["--isolation"] == "process" and "--superexec-auth-secret-file" in args
    assert "--disable-runtime-dependency-installation" in args
    assert args["--host"] == "0.0.0.0"  # inside the container: the compose network reaches it
    assert (("127.0.0.1", args["--port"], args["--port"]) in published_ports(SERVICES["superlink"])), \
        "the host's flwr CLI reaches the SuperLink on loopback"
    assert "/health" in " ".join(SERVICES["superlink"]["healthcheck"]["test"])


def test_control_api_is_published_on_loopback_only():
    assert control_api_exposed(COMPOSE) == []
    # SuperNodes and the SuperExec dial out over the compose network: nothing else is published.
    assert [n for n, s in SERVICES.items() if s.get("ports") and n != "superlink"] == []
    assert all(s.get("network_mode") != "host" for s in SERVICES.values())


@pytest.mark.parametrize("ports,exposed", [
    (["8000:8000"], True),  # the file before issue 36: every interface
    (["0.0.0.0:8000:8000"], True),
    (["[::]:8000:8000"], True),
    (["8000"], True),  # random host port, every interface
    (["203.0.113.7:8000:8000/tcp"], True),
    ([{"target": 8000, "published": 8000}], True),
    ([{"target": 8000, "published": 8000, "host_ip": "0.0.0.0"}], True),
    (["127.0.0.1:8000:8000"], False),
    (["[::1]:8000:8000"], False),
    ([{"target": 8000, "published": 8000, "host_ip": "127.0.0.1"}], False),
    (["0.0.0.0:9000:9000"], False),  # another container port is not the SuperLink's
])
def test_the_exposure_check_fires_on_public_bindings(ports, exposed):
    changed = copy.deepcopy(COMPOSE)
    changed["services"]["superlink"]["ports"] = ports
    assert bool(control_api_exposed(changed)) is exposed, control_api_exposed(changed)


def test_the_exposure_check_fires_on_host_networking():
    changed = copy.deepcopy(COMPOSE)
    changed["services"]["superlink"].pop("ports")
    changed["services"]["superlink"]["network_mode"] = "host"
    assert control_api_exposed(changed)


def test_open_source_flwr_has_no_control_api_account_authentication(monkeypatch):
    """What docs/deployment.md states: flwr 1.42's Control API authenticates accounts only through an
    OIDC plugin of Flower's enterprise package (FLWR_OIDC_ENABLED=1); without it every caller is the
    same no-op account. When a release ships one, this fails and the docs and compose file need a look."""
    from flwr.superlink.auth_plugin import NoOpControlAuthnPlugin
    from flwr.superlink.config_loader import load_control_authn_plugin

    monkeypatch.delenv("FLWR_OIDC_ENABLED", raising=False)
    plugin = load_control_authn_plugin()
    assert isinstance(plugin, NoOpControlAuthnPlugin)
    assert plugin.validate_tokens_in_metadata([])[0] is True  # no token, still valid
    monkeypatch.setenv("FLWR_OIDC_ENABLED", "1")
    with pytest.raises(SystemExit, match="unavailable in this Flower distribution"):
        load_control_authn_plugin()


def test_every_component_dials_the_superlink_it_trusts():
    link = split_command(SERVICES["superlink"]["command"])
    address = f"superlink:{link['--port']}"
    serverapp = split_command(SERVICES["serverapp"]["command"])
    assert serverapp["--runtime-api-address"] == address
    assert serverapp["--superexec-auth-secret-file"] == link["--superexec-auth-secret-file"]
    assert mounts("serverapp")[serverapp["--superexec-auth-secret-file"]] == \
        mounts("superlink")[link["--superexec-auth-secret-file"]]
    assert mounts("serverapp")[serverapp["--root-certificates"]] == mounts("superlink")[link["--ssl-ca-certfile"]]
    for name in SUPERNODES:
        args = split_command(SERVICES[name]["command"])
        assert args["--superlink"] == address, name
        assert mounts(name)[args["--root-certificates"]] == mounts("superlink")[link["--ssl-ca-certfile"]]
    # The certificate must name the host the containers dial.
    assert "--san superlink" in (DOCKER / "gen_certs.sh").read_text()


def test_supernodes_have_own_keys_and_node_configs():
    assert len(SUPERNODES) >= 3
    keys, parts = set(), []
    for name in SUPERNODES:
        args = split_command(SERVICES[name]["command"])
        key = mounts(name)[args["--auth-supernode-private-key"]]
        assert key == f"./certs/supernodes/{name}.key", key  # the file gen_certs.sh writes for it
        keys.add(key)
        cfg = parse_config_args([args["--node-config"]])  # exactly how flower-supernode parses it
        assert set(cfg) == {"partition-id", "num-partitions", "data-path"}, cfg
        parts.append(cfg["partition-id"])
        assert cfg["num-partitions"] == len(SUPERNODES)
        assert cfg["data-path"] in mounts(name), f"{name}: data-path {cfg['data-path']} is not mounted"
        assert SERVICES[name]["depends_on"]["register"]["condition"] == "service_completed_successfully"
    assert len(keys) == len(SUPERNODES)
    assert sorted(parts) == list(range(len(SUPERNODES)))


def test_mounted_files_are_named_in_commands_and_generated(tmp_path):
    certs.write_all(tmp_path, ["superlink"], supernodes=len(SUPERNODES))
    generated = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    for name, svc in SERVICES.items():
        text = " ".join(svc.get("command", [])) + " " + " ".join(svc.get("entrypoint", []))
        for container, host in mounts(name).items():
            if host.startswith("./certs/"):
                assert host[len("./certs/"):] in generated, f"{name} mounts {host}, which gen_certs.sh never writes"
                assert container in text, f"{name}: {container} is mounted but no command uses it"
        for path in re.findall(r"(?<![\w.])(/(?:certs|keys)/[\w./-]+)", text):
            assert path in mounts(name), f"{name} uses {path}, which is not mounted"


def test_register_service_runs_valid_deploy_commands():
    svc = SERVICES["register"]
    assert svc["entrypoint"][:2] == ["/bin/sh", "-c"]
    link = split_command(SERVICES["superlink"]["command"])
    parsed = []
    for part in svc["command"][0].split("&&"):
        argv = shlex.split(part)
        assert argv[:3] == ["python", "-m", "deploy.flwr_cli"], argv
        parsed.append(flwr_cli.build_parser().parse_args(argv[3:]))
    conn, reg = parsed
    assert conn.cmd == "connection" and reg.cmd == "register"
    assert conn.address == f"superlink:{link['--port']}" and conn.name == reg.superlink
    assert conn.flwr_home == reg.flwr_home and reg.skip_registered
    assert mounts("register")[reg.list] == f"./certs/{certs.AUTHORIZED_LIST}"
    assert mounts("register")[conn.root_certificates] == mounts("superlink")[link["--ssl-ca-certfile"]]


def compose_command() -> list[str] | None:
    """``docker compose`` (v2 plugin) or ``docker-compose`` (v1, Debian 12's), whichever works here."""
    if shutil.which("docker") is not None:
        res = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
        if res.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose") is not None:
        res = subprocess.run(["docker-compose", "version"], capture_output=True, text=True, timeout=60)
        if res.returncode == 0:
            return ["docker-compose"]
    return None


DOCKER_OPT_IN = "PPFL_DOCKER_TESTS"


def docker_skip_reason() -> str | None:
    """Why the Docker tests do not run here (None: they run): they need Compose and the opt-in."""
    if os.environ.get(DOCKER_OPT_IN) != "1":
        return f"Docker tests are opt-in: set {DOCKER_OPT_IN}=1 (and have Docker + Compose) to run them"
    if compose_command() is None:
        return "no Docker Compose on this machine (`docker compose` plugin or `docker-compose`)"
    return None


@pytest.mark.skipif(docker_skip_reason() is not None, reason=str(docker_skip_reason()))
def test_docker_compose_config_validates():  # pragma: no cover - only where Docker Compose exists, opted in
    compose = compose_command()
    assert compose is not None
    # -p: no top-level `name:` in the file (docker-compose v1 refuses it)
    res = subprocess.run([*compose, "-p", "ppfl-federation", "-f", str(DOCKER / "compose.yaml"), "config", "--quiet"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_compose_file_has_no_top_level_name():
    """docker-compose v1 (Debian 12's) refuses a top-level ``name:``; scripts pass ``-p`` instead."""
    assert "name" not in COMPOSE
