"""How often the audit's verdict flags each broken DP mechanism, and how often it flags a correct one (issue 37).

    python -m benchmarks.audit_detection                          # smoke presets, 20 seeds, every study
    python -m benchmarks.audit_detection --presets reduced --seeds 5
    python -m benchmarks.audit_detection --studies dfl-dp --frameworks fl --seeds 3
    python -m benchmarks.audit_detection --log results_audit/detection.jsonl --markdown   # the kept log
    python -m benchmarks.audit_detection --log results_audit/detection.jsonl --report-only --presets smoke reduced

A trial is one real run through the study's code path with its audit on: dfl-dp and tabular-pdp
through Flower's simulation (``flower_apps/<study>/audit_trial.py``: ServerApp, ClientApps, the
mechanism with its canaries, the broken mechanism of ``privacy/faults.py`` when asked), ultrasound
through the real ClientApp handler and Opacus optimizer with white-box gradient canaries
(``flower_apps/ultrasound/audit_trial.py``). Each trial's noise and canaries come from a seed file
made from its seed, so a trial repeats bit for bit.

dfl-dp at the reduced preset (N = 100, T = 20: ~2 min per run) is *replayed* by default, as issue 37
allows: per seed the correct mechanism trains once (a real run, its own trial) with its client replies
recorded, and each fault reruns the real ``server_main`` (strategy stack, fault, canaries through the
clip, auditor) on those recorded client updates (``flower_apps/common/replay.py``; the replay of the
correct mechanism reproduces the recorded audit bit for bit, tests/flower_apps/test_replay.py).
``--replay none`` retrains every trial; ``--replay all`` replays at the smoke preset too. Every log row
says which (``mode``: retrain / replay).

A fault counts as detected when the run's verdict is ``violation``; a correct run (fault '') counts as
a false positive when its verdict is ``violation``. ``underpowered`` counts as not detected (and is
reported). Targets (issue 37): detection >= 95% per fault, false positives <= 5%; the interval beside
each rate is the exact (Clopper-Pearson) 95% interval over the seeds run.

Presets: ``smoke`` is each study's smoke preset; ``reduced`` is the CPU-scale one the README's tables
use (dfl-dp and tabular-pdp ``reduced``, ultrasound ``cpu`` with the cpu grid's DP recipe, a DP linear
probe on the frozen pretrained trunk; it needs ../shared/data/busi). Every finished trial is appended to
``--log`` (one JSON line, flushed), and a rerun with the same log skips the trials already there, so an
interrupted benchmark loses nothing finished.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DETECTION_TARGET = 0.95
FALSE_POSITIVE_TARGET = 0.05
STUDIES = ("dfl-dp", "tabular-pdp", "ultrasound")
PRESETS = ("smoke", "reduced")
#: the preset each study runs for the benchmark's preset names (ultrasound's CPU-scale preset is 'cpu')
STUDY_PRESET = {("ultrasound", "reduced"): "cpu"}
DFL_FRAMEWORKS = ("fl", "sequential-dfl")


def study_preset(study: str, preset: str) -> str:
    return STUDY_PRESET.get((study, preset), preset)


def units(study: str, frameworks: Iterable[str] = DFL_FRAMEWORKS) -> list[str]:
    """The mechanisms of ``study`` counted apart: dfl-dp per framework, the others as one."""
    return list(frameworks) if study == "dfl-dp" else [""]


def faults_of(study: str) -> list[str]:
    from privacy.faults import FAULTS_BY_STUDY

    return ["", *FAULTS_BY_STUDY[study]]


# --- trials ---------------------------------------------------------------------------------------

def _trial_row(study: str, preset: str, unit: str, fault: str, seed: int, audit: dict, wall: float | None,
               mode: str = "retrain") -> dict:
    """One log line: what ran (``mode``: retrain, or replay on recorded client updates), the verdict, the tests that fired."""
    return {"study": study, "preset": preset, "unit": unit, "fault": fault, "seed": seed, "mode": mode,
            "verdict": audit["verdict"], "fired": fired_tests(audit), "wall_seconds": wall}


def fired_tests(audit: dict) -> list[str]:
    """The tests that fired: dfl-dp's and ultrasound's by name, tabular-pdp's as ``setting:client:test``."""
    if "verdict_detail" in audit:
        return sorted(audit["verdict_detail"]["fired"])
    if "fired" in audit:
        return sorted(audit["fired"])
    return sorted(f"{setting}:{g}:{t}" for setting in ("gdp", "pdp") if isinstance(audit.get(setting), dict)
                  for g, c in audit[setting].get("clients", {}).items() for t in c["verdict"]["fired"])


def run_seed(study: str, preset: str, unit: str, faults: list[str], seed: int, replay: bool = False) -> list[dict]:
    """Every fault (and the correct mechanism) of one study unit at one seed; one log row each.

    ``replay`` (dfl-dp only): the correct mechanism trains (recorded), the faults replay on its client updates.
    """
    sp = study_preset(study, preset)
    if study == "dfl-dp" and replay:
        from flower_apps.dfl_dp.audit_trial import audit_replays

        got = audit_replays(seed, [f for f in faults if f], sp, unit)
        return [_trial_row(study, preset, unit, a["trial"]["fault"], seed, a, a["trial"]["wall_seconds"],
                           "replay" if a["trial"]["replayed"] else "retrain") for a in got]
    if study == "dfl-dp":
        from flower_apps.dfl_dp.audit_trial import audit_trials

        got = audit_trials([(f, seed) for f in faults], sp, unit)
        return [_trial_row(study, preset, unit, f, seed, a, a["trial"]["wall_seconds"]) for f, a in zip(faults, got)]
    if study == "tabular-pdp":
        # its own name: the dfl-dp audit_trials above has another signature (mypy types a name once per function)
        from flower_apps.tabular_pdp.audit_trial import audit_trials as tabular_audit_trials

        got = tabular_audit_trials([(f, seed) for f in faults], sp)
        return [_trial_row(study, preset, unit, f, seed, a, a["trial"]["wall_seconds"]) for f, a in zip(faults, got)]
    if study == "ultrasound":
        from flower_apps.ultrasound.audit_trial import audit_trial
        from flower_apps.ultrasound.study import NOISE_SEED_ENV
        from flower_apps.ultrasound.sweep import CPU_DP_RECIPE

        # at the CPU scale, the DP recipe the study's cpu grid runs (a DP linear probe on a frozen trunk)
        recipe = dict(CPU_DP_RECIPE) if sp == "cpu" else {}
        rows = []
        for f in faults:
            with _noise_seed_file(NOISE_SEED_ENV, f"ultrasound audit trial, seed {seed}\n"):
                a = audit_trial(f, seed, sp, us_noise_mode="seeded", **recipe)
            rows.append(_trial_row(study, preset, unit, f, seed, a, a["wall_seconds"]))
        return rows
    raise ValueError(f"study {study!r}: expected one of {STUDIES}")


class _noise_seed_file:
    """A local seed file named by ``env`` for the duration (the ultrasound client reads its noise seed there)."""

    def __init__(self, env: str, text: str):
        self.env, self.text = env, text

    def __enter__(self):
        import tempfile

        self.dir = tempfile.TemporaryDirectory(prefix="audit-detection-")
        path = Path(self.dir.name) / "noise.seed"
        path.write_text(self.text)
        self.old = os.environ.get(self.env)
        os.environ[self.env] = str(path)
        return path

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop(self.env, None)
        else:
            os.environ[self.env] = self.old
        self.dir.cleanup()
        return False


# --- the log --------------------------------------------------------------------------------------

def read_log(path: Path | None) -> list[dict]:
    """The trials already logged, one per trial (the last if one was logged twice); a last line cut short by a
    crash is ignored."""
    if path is None or not path.exists():
        return []
    rows: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows[key(r)] = r
    return list(rows.values())


def append_log(path: Path | None, rows: list[dict]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def key(r: dict) -> tuple:
    return (r["study"], r["preset"], r["unit"], r["fault"], int(r["seed"]), r.get("mode", "retrain") == "replay")


def replays(study: str, preset: str, replay: str) -> bool:
    """Whether ``study`` at ``preset`` replays its faults under ``--replay`` (none / reduced / all)."""
    return study == "dfl-dp" and (replay == "all" or (replay == "reduced" and preset == "reduced"))


def run(studies: list[str], presets: list[str], seeds: dict[str, int], frameworks: list[str],
        log: Path | None, say: Callable[[str], None] = print, first_seed: int = 0, replay: str = "reduced") -> list[dict]:
    """Run every (study, preset, unit, seed) not yet in ``log``; all rows for the selection (logged + new)."""
    from privacy.faults import ALLOW_ENV

    old = os.environ.get(ALLOW_ENV)
    os.environ[ALLOW_ENV] = "1"  # the broken mechanisms are this benchmark's inputs; restored below
    try:
        return _run(studies, presets, seeds, frameworks, log, say, first_seed, replay)
    finally:
        if old is None:
            os.environ.pop(ALLOW_ENV, None)
        else:
            os.environ[ALLOW_ENV] = old


def _run(studies, presets, seeds, frameworks, log, say, first_seed, replay) -> list[dict]:
    done = {key(r): r for r in read_log(log)}
    rows = []
    for preset in presets:
        for study in studies:
            faults = faults_of(study)
            for unit in units(study, frameworks):
                rp = replays(study, preset, replay)
                for seed in range(first_seed, first_seed + seeds[preset]):
                    # the correct mechanism is always trained; under replay the faults are replayed on its updates
                    want = [(study, preset, unit, f, seed, rp and bool(f)) for f in faults]
                    if all(k in done for k in want):
                        rows += [done[k] for k in want]
                        continue
                    t0 = time.perf_counter()
                    new = run_seed(study, preset, unit, faults, seed, rp)
                    append_log(log, new)
                    rows += new
                    flagged = [r["fault"] or "correct" for r in new if r["verdict"] == "violation"]
                    say(f"[audit-detection] {study} {unit or '-'} {preset} seed {seed}: "
                        f"{time.perf_counter() - t0:.0f} s; violation: {flagged or 'none'}")
    return rows


# --- rates ----------------------------------------------------------------------------------------

def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import beta

    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def rates(rows: list[dict]) -> list[dict]:
    """Per (study, preset, unit, fault): n, violations, underpowered, rate, its interval, target, met."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["study"], r["preset"], r["unit"], r["fault"], r.get("mode", "retrain")), []).append(r)
    out = []
    for (study, preset, unit, fault, mode), rs in groups.items():
        n = len(rs)
        k = sum(r["verdict"] == "violation" for r in rs)
        lo, hi = clopper_pearson(k, n)
        correct = fault == ""
        rate = k / n
        out.append({"study": study, "preset": preset, "unit": unit, "fault": fault or "correct", "mode": mode, "n": n,
                    "violations": k, "underpowered": sum(r["verdict"] == "underpowered" for r in rs),
                    "rate": rate, "ci": (lo, hi),
                    "target": FALSE_POSITIVE_TARGET if correct else DETECTION_TARGET,
                    "met": rate <= FALSE_POSITIVE_TARGET if correct else rate >= DETECTION_TARGET,
                    "median_wall_seconds": _median([r["wall_seconds"] for r in rs if r.get("wall_seconds")])})
    return out


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def table(rate_rows: list[dict], markdown: bool = False) -> list[str]:
    head = ["study", "mechanism", "preset", "fault", "trials", "seeds", "flagged violation", "rate [95% CI]",
            "underpowered", "target", "met"]
    cells = []
    for r in rate_rows:
        what = "false positives" if r["fault"] == "correct" else "detection"
        op = "<=" if r["fault"] == "correct" else ">="
        cells.append([r["study"], r["unit"] or {"tabular-pdp": "gdp + pdp", "ultrasound": "dp-sgd"}.get(r["study"], "-"),
                      r["preset"], r["fault"], r["mode"], str(r["n"]), str(r["violations"]),
                      f"{r['rate']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]", str(r["underpowered"]),
                      f"{what} {op} {r['target']:.2f}", "yes" if r["met"] else ("**no**" if markdown else "NO")])
    if markdown:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(c) + " |" for c in cells]
    widths = [max(len(x) for x in col) for col in zip(head, *cells)]
    return ["  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip() for c in [head, ["-" * w for w in widths], *cells]]


DOC_START, DOC_END = "<!-- audit-detection:start -->", "<!-- audit-detection:end -->"


def doc_block(path: Path, block: str, write: bool, kept: Path | None = None) -> int:
    """Write ``block`` between the markers of ``path`` (atomic), or compare: 0 when equal/written, 1 when it differs.

    ``kept``: the table also lives in this file beside the log (``detection.md``), which the platform's docs
    check (``python -m flower_apps.report --check``) compares the document's block with.
    """
    from benchmarks.doc_blocks import replace_block, write_atomic

    text = path.read_text()
    new = replace_block(text, block, DOC_START, DOC_END, str(path))
    targets = [(path, text, new)]
    if kept is not None:
        targets.append((kept, kept.read_text() if kept.is_file() else "", block.strip() + "\n"))
    stale = [(p, n) for p, old, n in targets if old != n]
    if write:
        for p, n in stale:
            write_atomic(p, n)
        return 0
    for p, _ in stale:
        print(f"{p}: the audit-detection table differs from the log's; regenerate with --write-doc", file=sys.stderr)
    return 1 if stale else 0


# --- python -m benchmarks --------------------------------------------------------------------------

def measure(quick: bool = True) -> list[dict]:
    """Rows for ``python -m benchmarks``: quick = dfl-dp FL at the smoke preset, 2 seeds (the full
    benchmark is this module's own command); the target is on the value (rate)."""
    rows = run(["dfl-dp"], ["smoke"], {"smoke": 2 if quick else 20}, ["fl"], None, say=lambda s: print(s))
    out = []
    for r in rates(rows):
        correct = r["fault"] == "correct"
        out.append({"metric": f"audit {r['study']} {r['unit']} {r['preset']}: "
                              f"{'false-positive' if correct else r['fault'] + ' detection'} rate over {r['n']} seeds",
                    "value": r["rate"], "reference": None, "ratio": None, "target": r["target"], "met": r["met"]})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--studies", nargs="+", choices=STUDIES, default=list(STUDIES))
    p.add_argument("--presets", nargs="+", choices=PRESETS, default=["smoke"])
    p.add_argument("--seeds", type=int, default=None,
                   help="seeds per fault (default: 20 at smoke, 5 at reduced, the issue's minimums)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--frameworks", nargs="+", choices=DFL_FRAMEWORKS, default=list(DFL_FRAMEWORKS),
                   help="dfl-dp mechanisms to run")
    p.add_argument("--log", type=Path, default=None,
                   help="JSON-lines file of finished trials: appended to, and trials already there are not rerun")
    p.add_argument("--replay", choices=["none", "reduced", "all"], default="reduced",
                   help="dfl-dp presets whose faults replay on the correct run's recorded client updates instead of "
                        "retraining (default: reduced)")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--write-doc", type=Path, default=None, metavar="MD",
                   help=f"with --report-only: replace the table between {DOC_START} and {DOC_END} in MD "
                        "(docs/audit.md) by the log's")
    p.add_argument("--check-doc", type=Path, default=None, metavar="MD",
                   help="with --report-only: exit 1 when MD's block differs from the log's table")
    p.add_argument("--report-only", action="store_true",
                   help="no trial runs: the rates of the trials in --log for the selection (seeds not logged are "
                        "left out; the table says how many each rate rests on)")
    a = p.parse_args(argv)
    if a.seeds is not None and a.seeds < 1:
        p.error("--seeds must be >= 1")
    if a.first_seed < 0:
        p.error("--first-seed must be >= 0")
    seeds = {pr: a.seeds or (20 if pr == "smoke" else 5) for pr in a.presets}
    if a.report_only:
        if a.log is None or not a.log.exists():
            p.error("--report-only needs an existing --log")
        rows = [r for r in read_log(a.log) if r["study"] in a.studies and r["preset"] in a.presets
                and (r["study"] != "dfl-dp" or r["unit"] in a.frameworks)
                and a.first_seed <= int(r["seed"]) < a.first_seed + seeds[r["preset"]]]
        if not rows:
            p.error(f"{a.log} holds no trial of the selection")
        rr = rates(rows)
        print("\n".join(table(rr, a.markdown)))
        if a.write_doc or a.check_doc:
            return doc_block(a.write_doc or a.check_doc, "\n".join(table(rr, markdown=True)), write=bool(a.write_doc),
                             kept=a.log.with_suffix(".md"))
        return 0 if all(r["met"] for r in rr) else 1
    if a.write_doc or a.check_doc:
        p.error("--write-doc / --check-doc need --report-only (no trial runs)")
    rows = run(a.studies, a.presets, seeds, a.frameworks, a.log, say=lambda s: print(s, file=sys.stderr),
               first_seed=a.first_seed, replay=a.replay)
    rr = rates(rows)
    print("\n".join(table(rr, a.markdown)))
    return 0 if all(r["met"] for r in rr) else 1


if __name__ == "__main__":
    raise SystemExit(main())
