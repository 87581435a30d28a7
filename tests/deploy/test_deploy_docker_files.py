"""docker/: the compose file and Dockerfiles, checked without a Docker engine.

There is no Docker engine on the development machine, so images are never built here.
What is checked instead: every flag in the compose commands exists in the installed CLI's
``--help`` (``flower-superlink``, ``flower-supernode``, ``flower-superexec``, and
``python -m deploy.flwr_cli``) with a legal value; the wiring (ports, addresses, TLS files,
keys, the SuperExec secret, node configs) is consistent; every file a command names is
mounted and is one that docker/gen_certs.sh writes; the Dockerfiles' entry points are
Flower commands, their flwr pin is the project's, their dependency one-liner works, and
their ignore files admit exactly what they copy. ``docker compose config`` runs if Docker
is installed. The same flags run for real, without Docker, in test_deploy_federation.py.
"""

from __future__ import annotations

import json
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


def test_app_image_dependency_one_liner_reads_the_project_dependencies():
    run = dockerfile_stages(DOCKER / "app.Dockerfile")["deps"]["run"]
    line = next(r for r in run if "tomllib" in r)
    code = re.search(r'python -c "(.+?)"\s*>', line).group(1)
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert res.stdout.splitlines() == declared
    # The torch step picks torch and torchvision out of that list with this pattern.
    picked = [r for r in declared if re.match(r"^(torch|torchvision)==", r)]
    assert [p.split("==")[0] for p in picked] == ["torch", "torchvision"]


@pytest.mark.parametrize("dockerfile", ["superlink.Dockerfile", "app.Dockerfile"])
def test_dockerignore_admits_what_is_copied_and_no_keys(dockerfile):
    ignore = [ln.strip() for ln in (DOCKER / f"{dockerfile}.dockerignore").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    assert ignore[0] == "**"  # deny by default, then admit
    for stage in dockerfile_stages(DOCKER / dockerfile).values():
        for sources in stage["copy"]:
            for src in sources:
                assert (REPO / src).exists(), src
                assert f"!{src}" in ignore, f"{src} is copied but excluded from the build context"
    assert not any(p.startswith("!docker") for p in ignore)  # docker/certs never enters a build


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
    assert args["--host"] == "0.0.0.0"
    assert f"{args['--port']}:{args['--port']}" in SERVICES["superlink"]["ports"]
    assert "/health" in " ".join(SERVICES["superlink"]["healthcheck"]["test"])


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


def _has_compose() -> bool:
    if shutil.which("docker") is None:
        return False
    res = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
    return res.returncode == 0


@pytest.mark.skipif(not _has_compose(), reason="no `docker compose` on this machine (a docker CLI without "
                                                "the compose plugin or engine does not count)")
def test_docker_compose_config_validates():  # pragma: no cover - only where Docker Compose exists
    res = subprocess.run(["docker", "compose", "-f", str(DOCKER / "compose.yaml"), "config", "--quiet"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
