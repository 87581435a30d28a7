"""``flwr run`` with the project's own checks first and an exit status that says how the run ended.

    python -m deploy.launch [APP_DIR] [SUPERLINK] --run-config "study='dfl-dp' preset='smoke'"

What plain ``flwr run . --stream`` does not do (flwr 1.42), and this command does:

1. validate the run config *before* Flower sees it, so an unknown key is named with the nearest
   valid one (Flower's SuperLink only answers "[code: 15] Invalid run configuration.") and a bad
   value is one line (``ConfigError``), exit status 2;
2. follow the run's logs (``--stream``), then ask the SuperLink how the run ended
   (``flwr list --run-id``) and exit 1 when it did not finish as completed: ``flwr run --stream``
   itself exits 0 after a failed run.

Data errors are found by the ServerApp before any work; it logs them as one line
(``run refused before any work: ...``) and the run ends as failed, hence exit status 1 here.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from deploy.flwr_cli import executable
from strategies.flwr_adapter import parse_run_config

EXIT_REFUSED = 2
EXIT_RUN_FAILED = 1
RUN_ID = re.compile(r"Successfully started run (\d+)")


def check_run_config(run_config: list[str]) -> dict:
    """Parse ``--run-config`` strings as Flower does and resolve them with the project's rules."""
    from flower_apps.config import RUN_CONFIG_DEFAULTS
    from flower_apps.router import check_export_config, prepare

    overrides = parse_run_config(run_config) if run_config else {}
    prepare({**RUN_CONFIG_DEFAULTS, **overrides})
    # as the ServerApp resolves it (the keys given win over the preset), checked against its export.json
    check_export_config(*prepare({**RUN_CONFIG_DEFAULTS, **overrides}, given=overrides))
    return overrides


def run_status(run_id: int, superlink: str | None) -> dict:
    """``flwr list --run-id`` as a dict (status is e.g. 'finished:completed' or 'finished:failed')."""
    args = [_flwr(), "list", *([superlink] if superlink else []), "--run-id", str(run_id), "--format", "json"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL).stdout
    start = out.find("{")
    if start < 0:
        return {"status": "unknown", "details": out.strip()[-300:]}
    runs = json.loads(out[start:]).get("runs") or [{}]
    return dict(runs[0])


def _flwr() -> str:
    return executable("flwr")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.launch", description=__doc__.split("\n")[0])
    p.add_argument("app", nargs="?", default=".", help="the Flower App folder (default: .)")
    p.add_argument("superlink", nargs="?", default=None, help="SuperLink connection name (default: flwr's default)")
    p.add_argument("--run-config", action="append", default=[], help="as for flwr run (may repeat)")
    p.add_argument("--federation-config", default=None, help="as for flwr run")
    args = p.parse_args(argv)
    try:
        check_run_config(args.run_config)
    except ValueError as exc:  # ConfigError, and Flower's own parse errors
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    cmd = [_flwr(), "run", str(Path(args.app)), *([args.superlink] if args.superlink else []), "--stream"]
    for rc in args.run_config:
        cmd += ["--run-config", rc]
    if args.federation_config:
        cmd += ["--federation-config", args.federation_config]
    run_id = None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          stdin=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            m = RUN_ID.search(line)
            if m and run_id is None:
                run_id = int(m.group(1))
    if proc.returncode != 0 or run_id is None:
        print(f"error: flwr run exited {proc.returncode} without starting a run", file=sys.stderr)
        return proc.returncode or EXIT_RUN_FAILED
    info = run_status(run_id, args.superlink)
    status = str(info.get("status", "unknown"))
    print(f"run {run_id}: {status}", file=sys.stderr)
    return 0 if status == "finished:completed" else EXIT_RUN_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
