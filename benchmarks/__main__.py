"""Every benchmark at a quick setting, one table: metric, value, same-run reference, ratio, target, met.

    python -m benchmarks                                # print the table (~3-5 min on 2 cores)
    python -m benchmarks --only dfl-dp-round sphinx     # a subset (--list names them)
    python -m benchmarks --markdown                     # Markdown, headed by the machine it ran on
    python -m benchmarks --markdown --write-readme      # ... and regenerate README.md's block

``--write-readme`` replaces what lies between ``<!-- benchmarks:start -->`` and
``<!-- benchmarks:end -->`` in README.md (atomically). A benchmark that cannot run here (a harness
missing or failing) gives one row saying so instead of stopping the others; the exit status is 1
when that happened, 0 otherwise (a target not met is a result, not an error).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import doc_blocks  # noqa: E402
from flower_apps.common.bench_table import fmt, met_text, table_lines, target_text  # noqa: E402,F401
from registry import Registry  # noqa: E402

START, END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"
FIELDS = ("metric", "value", "reference", "ratio", "target", "met")
BENCHMARKS: Registry[Callable[[], list[dict]]] = Registry("benchmark")


# --- rows ---------------------------------------------------------------------------------------

def skipped_row(name: str, reason: str) -> dict:
    """The one row of a benchmark that could not run here."""
    return {"metric": f"{name}: not run ({reason})", "value": None, "reference": None, "ratio": None,
            "target": None, "met": None}


def check_rows(name: str, rows: list[dict]) -> list[dict]:
    """Refuse a harness's rows that lack a field; fill in the ratio and how to read the target."""
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"benchmark {name!r} returned no rows, expected a list of dicts with {FIELDS}")
    out = []
    for r in rows:
        missing = [f for f in FIELDS if f not in r]
        if missing:
            raise ValueError(f"benchmark {name!r} row {r.get('metric', r)!r} lacks {missing}")
        r = {"target_on": "ratio", "op": "<=", **r}
        if r["ratio"] is None and r["value"] is not None and r["reference"]:
            r["ratio"] = r["value"] / r["reference"]
        out.append(r)
    return out


def _target_read_from_met(rows: list[dict]) -> list[dict]:
    """For harnesses whose targets are on the value: say so, with the direction ``met`` implies."""
    for r in rows:
        if r["target"] is not None and r["met"] is not None and r["value"] is not None:
            r["target_on"] = "value"
            r["op"] = "<=" if (r["value"] <= r["target"]) == bool(r["met"]) else ">="
    return rows


# --- the registry -------------------------------------------------------------------------------

def _harness(module: str, func: str = "measure"):
    """``benchmarks.<module>.<func>``, or None with the reason when it is not there."""
    try:
        mod = importlib.import_module(f"benchmarks.{module}")
    except Exception as ex:  # any import failure means "cannot run here", said in the row
        return None, f"import failed: {type(ex).__name__}: {ex}"
    fn = getattr(mod, func, None)
    return (fn, "") if callable(fn) else (None, f"benchmarks/{module}.py has no {func}()")


@BENCHMARKS.decorator("dfl-dp-round")
def dfl_dp_round() -> list[dict]:
    """FL and one-message-per-hop sequential DFL round through Flower over the plain loop (quick setting)."""
    fn, why = _harness("dfl_dp_round")
    return fn(quick=True) if fn else [skipped_row("dfl-dp-round", why)]


@BENCHMARKS.decorator("sphinx")
def sphinx() -> list[dict]:
    """Sphinx unwrap/creation cost in X25519 units (targets on the value) and rates against Nym."""
    fn, why = _harness("mixnet_sphinx_throughput")
    return _target_read_from_met(fn()) if fn else [skipped_row("sphinx", why)]


@BENCHMARKS.decorator("dpsgd-overhead")
def dpsgd_overhead() -> list[dict]:
    """DP-SGD (ghost clipping) step over the non-private step, per ultrasound backbone."""
    fn, why = _harness("ultrasound_dpsgd_overhead")
    return fn(quick=True) if fn else [skipped_row("dpsgd-overhead", why)]


@BENCHMARKS.decorator("channels-last")
def channels_last() -> list[dict]:
    """Ultrasound non-DP local training in channels-last layout over the default layout (Lite0, 160 px)."""
    fn, why = _harness("ultrasound_channels_last")
    return fn(quick=True) if fn else [skipped_row("channels-last", why)]


@BENCHMARKS.decorator("centralized-threads")
def centralized_threads() -> list[dict]:
    """Ultrasound centralized training on every core over one thread (wall time; run on an idle machine)."""
    fn, why = _harness("ultrasound_centralized_threads")
    return fn(quick=True) if fn else [skipped_row("centralized-threads", why)]


@BENCHMARKS.decorator("dp-frozen-prefix")
def dp_frozen_prefix() -> list[dict]:
    """Ultrasound DP (ghost) step of head-only / last-layers training: parameters vs batch as the target."""
    fn, why = _harness("ultrasound_dp_frozen_prefix")
    return fn(quick=True) if fn else [skipped_row("dp-frozen-prefix", why)]


@BENCHMARKS.decorator("dp-head-feature-cache")
def dp_head_feature_cache() -> list[dict]:
    """Ultrasound DP-SGD on the classifier of a frozen trunk: cached trunk features over the whole network."""
    fn, why = _harness("ultrasound_feature_cache")
    return fn(quick=True) if fn else [skipped_row("dp-head-feature-cache", why)]


@BENCHMARKS.decorator("mixnet-round")
def mixnet_round() -> list[dict]:
    """Wall seconds per simulated mixnet round, N = 32, K = 2, O = 100, mu = 0.1, cover (target <= 4 s, on the value)."""
    fn, why = _harness("mixnet_round")
    return _target_read_from_met(fn(quick=True)) if fn else [skipped_row("mixnet-round", why)]


@BENCHMARKS.decorator("audit-overhead")
def audit_overhead() -> list[dict]:
    """Wall time of a run with --audit over the same run without it, dfl-dp and tabular-pdp (issue 13, ~2 min)."""
    fn, why = _harness("audit_overhead")
    return fn(quick=True) if fn else [skipped_row("audit-overhead", why)]


@BENCHMARKS.decorator("partition")
def partition_scale() -> list[dict]:
    """Dirichlet partition of 40,000-400,000 labels for N = 100 ... 100,000 clients (a minimum per client
    guaranteed) over one draw's bare Dirichlet calls (issue 40)."""
    fn, why = _harness("partition_scale")
    return fn() if fn else [skipped_row("partition", why)]


@BENCHMARKS.decorator("mixnet-scale")
def mixnet_scale() -> list[dict]:
    """Mixnet simulator CPU seconds per node-round and peak RSS at N = 32, 128, 512 and the fitted growth
    (issue 40; N = 32 ... 1,024: python benchmarks/mixnet_scale.py)."""
    fn, why = _harness("mixnet_scale")
    return fn((32, 128, 512)) if fn else [skipped_row("mixnet-scale", why)]


@BENCHMARKS.decorator("engine")
def engine() -> list[dict]:
    """Seconds per dfl-dp smoke run through the default engine (flwr run on a local SuperLink) and the in-process
    one (~2.5 min; the full benchmark: python benchmarks/engine_overhead.py --runs N)."""
    fn, why = _harness("engine_overhead", "rows")
    return fn() if fn else [skipped_row("engine", why)]


@BENCHMARKS.decorator("audit-detection")
def audit_detection() -> list[dict]:
    """How often the audit flags each broken DP mechanism (dfl-dp FL, smoke, 2 seeds; the full benchmark:
    python -m benchmarks.audit_detection). Targets on the value: detection >= 0.95, false positives <= 0.05."""
    fn, why = _harness("audit_detection")
    return _target_read_from_met(fn(quick=True)) if fn else [skipped_row("audit-detection", why)]


def run_all(names: list[str], benchmarks: dict[str, Callable[[], list[dict]]] | None = None,
            log=print) -> tuple[list[dict], bool]:
    """Run ``names`` in order; (rows with a ``benchmark`` field, whether every one ran)."""
    benchmarks = BENCHMARKS if benchmarks is None else benchmarks
    unknown = [n for n in names if n not in benchmarks]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; known: {sorted(benchmarks)}")
    rows, ok = [], True
    for name in names:
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(sys.stderr):  # harnesses' progress lines; the table owns stdout
                got = check_rows(name, benchmarks[name]())
        except Exception as ex:  # one failing harness must not hide the others' rows
            got = [skipped_row(name, f"{type(ex).__name__}: {ex}")]
        ok &= not any(r["metric"].startswith(f"{name}: not run") for r in got)
        rows += [{"benchmark": name, **r} for r in got]
        log(f"[benchmarks] {name}: {len(got)} rows in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return rows, ok


# --- output -------------------------------------------------------------------------------------

def machine() -> dict[str, str]:
    """Where the table was measured: CPU model, cores, load, library versions, date (UTC)."""
    model = platform.processor() or platform.machine()
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                model = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for pkg in ("torch", "flwr", "numpy", "opacus", "cryptography"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "absent"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "cores": str(cores), "load": f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?",
            "python": platform.python_version(), **versions,
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}


def markdown_block(rows: list[dict], info: dict[str, str], command: str, seconds: float) -> str:
    libs = ", ".join(f"{k} {info[k]}" for k in ("torch", "flwr", "numpy", "opacus", "cryptography") if k in info)
    return "\n".join([
        f"Generated by `{command}` on {info['date']}: {info['cpu']}, {info['cores']} cores, load average "
        f"{info['load']} at the start; Python {info['python']}, {libs}; {seconds / 60:.1f} min. Each ratio is "
        "measured against its reference in the same run; on a shared machine they move, rerun where you measure.",
        "",
        *table_lines(rows, markdown=True),
    ])


KEPT = Path("results_bench")  # the measured rows and their block, kept in the repository


def keep(rows: list[dict], info: dict[str, str], command: str, seconds: float, folder: Path) -> None:
    """Keep what the README's block shows: the rows as measured (``benchmarks.json``) and the block itself
    (``benchmarks.md``, rendered from that JSON; tests/benchmarks checks the two agree)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    data = {"machine": info, "command": command, "seconds": seconds, "rows": rows}
    text = json.dumps(data, indent=1, sort_keys=True, default=lambda o: o.item() if hasattr(o, "item") else str(o))
    write_atomic(folder / "benchmarks.json", text + "\n")
    write_atomic(folder / "benchmarks.md", block_from_kept(json.loads(text)) + "\n")  # what was kept, rendered


def block_from_kept(data: dict) -> str:
    """README's benchmarks block from a kept ``benchmarks.json``."""
    return markdown_block(data["rows"], data["machine"], data["command"], data["seconds"])


def replace_block(text: str, block: str) -> str:
    """``text`` with what lies between the benchmark markers replaced by ``block``."""
    return doc_blocks.replace_block(text, block, START, END, "README")


write_atomic = doc_blocks.write_atomic


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+", metavar="NAME", help="run these benchmarks (default: all)")
    p.add_argument("--list", action="store_true", help="name each benchmark and exit")
    p.add_argument("--markdown", action="store_true", help="print Markdown with the machine it ran on")
    p.add_argument("--write-readme", action="store_true", help="replace README.md's benchmarks block (implies --markdown)")
    p.add_argument("--readme", type=Path, default=ROOT / "README.md")
    p.add_argument("--kept", type=Path, default=None,
                   help="with --write-readme: where the measured rows are kept (benchmarks.json) with the block "
                        "(benchmarks.md) that python -m flower_apps.report --check compares README.md with "
                        f"(default: {KEPT}/ beside the README written)")
    args = p.parse_args(argv)
    if args.kept is None:  # beside the README it belongs to: a README elsewhere never overwrites the repository's
        args.kept = args.readme.parent / KEPT
    if args.list:
        for name, fn in BENCHMARKS.items():
            print(f"{name}: {(fn.__doc__ or '').strip()}")
        return 0
    if args.write_readme:  # fail before minutes of measuring, not after
        replace_block(args.readme.read_text(), "")
    names = args.only or list(BENCHMARKS)
    info, t0 = machine(), time.perf_counter()
    rows, ok = run_all(names)
    seconds = time.perf_counter() - t0
    if args.markdown or args.write_readme:
        command = "python -m benchmarks --markdown --write-readme" + (f" --only {' '.join(names)}" if args.only else "")
        block = markdown_block(rows, info, command, seconds)
        print(block)
        if args.write_readme:
            keep(rows, info, command, seconds, args.kept)
            write_atomic(args.readme, replace_block(args.readme.read_text(), block))
            print(f"\n[benchmarks] wrote {args.readme} and {args.kept}/benchmarks.{{json,md}}", file=sys.stderr)
    else:
        print("\n".join(table_lines(rows, markdown=False)))
        print(f"\n{info['cpu']}, {info['cores']} cores, load {info['load']} at start, {info['date']}, "
              f"{seconds:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
