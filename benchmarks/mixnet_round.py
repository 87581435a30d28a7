"""Wall seconds per simulated mixnet round at the paper's setting (issue 17), for ``python -m benchmarks``.

Workload = :func:`benchmarks.mixnet_simulation_speed.run` (one harness, not a second copy):
N = 32 nodes, degree-4 circulant, K = 2, O = 100, mu = 0.1 s, sigma = 0.001, cover traffic
on (policy ``data``), 10,240-byte bodies, every node sending one update of ``F`` fragments
to each neighbour; real Sphinx work at every hop (creation, unwrap, SURB acks). ``F`` = 7
is LeNet-5 at 8 bits (the paper's default encoding), 26 at 32 bits.

Reference: the paper prototype's ~40 s per round; target: <= 4 s per round (on the value).
Also printed: where the time goes (cProfile, top functions by own time) with ``--profile``.

    python benchmarks/mixnet_round.py [--fragments 7 26] [--rounds 1] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.mixnet_simulation_speed import PAPER_WALL_PER_ROUND_S, run

TARGET_S_PER_ROUND = 4.0


def measure(quick: bool = True, fragments: tuple[int, ...] | None = None, rounds: int | None = None) -> list[dict]:
    """Rows ``{metric, value, reference, ratio, target, met}``: value = wall s per round (target on the value)."""
    fragments = fragments or ((7,) if quick else (7, 26))
    rounds = rounds or (1 if quick else 2)
    rows = []
    for f in fragments:
        r = run(32, f, rounds, "data", 0, entropy=False)
        per_round = r["wall_s"] / rounds
        print(f"mixnet round N=32 K=2 O=100 mu=0.1 cover F={f}: {per_round:.2f} wall s/round "
              f"(CPU {r['cpu_s'] / rounds:.2f} s, virtual {r['virtual_s'] / rounds:.2f} s, packets {r['packets']}, "
              f"undelivered {r['undelivered']})", flush=True)
        rows.append({"metric": f"mixnet round N=32 K=2 O=100 mu=0.1 cover, F={f} fragments/neighbour: wall s",
                     "value": per_round, "reference": PAPER_WALL_PER_ROUND_S, "ratio": per_round / PAPER_WALL_PER_ROUND_S,
                     "target": TARGET_S_PER_ROUND, "met": per_round <= TARGET_S_PER_ROUND})
        # Process CPU per round: what the wall time would be on an otherwise idle core (the machine is shared).
        cpu = r["cpu_s"] / rounds
        rows.append({"metric": f"mixnet round, F={f}: process CPU s (wall on an idle core)", "value": cpu,
                     "reference": PAPER_WALL_PER_ROUND_S, "ratio": cpu / PAPER_WALL_PER_ROUND_S,
                     "target": TARGET_S_PER_ROUND, "met": cpu <= TARGET_S_PER_ROUND})
    return rows


def profile(fragments: int, top: int = 20) -> str:
    """cProfile of one round: the ``top`` functions by own time."""
    prof = cProfile.Profile()
    prof.enable()
    run(32, fragments, 1, "data", 0, entropy=False)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fragments", type=int, nargs="+", default=[7, 26])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="also print where one F=7 round spends its time")
    args = p.parse_args()
    for r in measure(quick=False, fragments=tuple(args.fragments), rounds=args.rounds):
        print(f"{r['metric']}: {r['value']:.2f} s (paper ~{r['reference']:.0f} s, x{1 / r['ratio']:.1f} faster; "
              f"target <= {r['target']:.0f} s: {'met' if r['met'] else 'NOT met'})")
    if args.profile:
        print(profile(args.fragments[0]))


if __name__ == "__main__":
    main()
