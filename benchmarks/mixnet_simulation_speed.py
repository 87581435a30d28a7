"""Simulation speed: virtual seconds simulated per wall second, and peak memory.

Workload (one DFL round of the paper's setting): N = 32 nodes on a degree-4
circulant graph, K = 2, O = 100, mu = 0.1 s, sigma = 0.001, cover traffic on,
10,240-byte bodies; every node sends one model update split into ``F``
fragments to each of its 4 neighbours (``F`` = 7 by default, the paper's range
is about 7-26). Real Sphinx processing at every hop.

Prints the virtual time the round took (first send to last delivery), the wall
time, their ratio (target: >= 10x faster than real time), the wall time per
round against the paper prototype's ~40 s, traffic by kind, per-node CPU, the
per-relay entropy diagnostic, and the peak memory (ru_maxrss) of a separate
N = 100 run.

    python benchmarks/mixnet_simulation_speed.py [--nodes 32] [--fragments 7] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from mixnet.config import MixnetConfig
from mixnet.messages import fragment_capacity
from mixnet.metrics import h_path, h_relay, relay_mapping_entropy
from mixnet.simulator import Simulator

PAPER_WALL_PER_ROUND_S = 40.0
TARGET_SPEEDUP = 10.0
# Nym's Rust Sphinx, per core on a laptop (the anchor; benchmarks/mixnet_sphinx_throughput.py).
NYM_UNWRAPS_PER_S = 6350.0
NYM_CREATIONS_PER_S = 2600.0


def run(nodes: int, fragments: int, rounds: int, cover_policy: str, seed: int, entropy: bool) -> dict:
    cfg = MixnetConfig(max_path_length=2, outbox_size=100, mu=0.1, sigma=0.001, cover_traffic=True,
                       cover_policy=cover_policy)
    sim = Simulator(cfg, nodes, seed=seed, topology="circulant", degree=4, latency=0.005)
    update = bytes(fragments * fragment_capacity(cfg.packet_format))
    wall_total, cpu_total, virtual_total, batch_times = 0.0, 0.0, 0.0, []
    for _ in range(rounds):
        start_virtual, start_wall, start_cpu = sim.now, time.perf_counter(), time.process_time()
        ids = [sim.send(i, j, update) for i in range(nodes) for j in sim.topology.neighbours(i)]
        sim.run_until_idle()
        wall_total += time.perf_counter() - start_wall
        cpu_total += time.process_time() - start_cpu
        virtual_total += sim.now - start_virtual
        batch_times.append(sim.batch_delivery_time(ids))
    stats = sim.node_stats()
    kinds = {k: sum(s.packets_sent[k] for s in stats.values()) for k in next(iter(stats.values())).packets_sent}
    out = {
        "nodes": nodes, "fragments_per_neighbour": fragments, "rounds": rounds, "cover_policy": cover_policy,
        "wall_s": wall_total, "cpu_s": cpu_total, "virtual_s": virtual_total, "batch_virtual_s": batch_times,
        "packets": kinds, "bytes_sent": sum(s.total_bytes_sent for s in stats.values()),
        "cpu_s_per_node": sum(s.cpu_time_s for s in stats.values()) / nodes,
        # every Sphinx frame a node receives is one unwrap (control frames are not Sphinx packets)
        "unwraps": sum(s.packets_received for s in stats.values()) - kinds["control"],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "undelivered": sum(r.delivered is None for r in sim.message_records().values()),
        "retransmissions": kinds["retransmission"],
    }
    if entropy:
        view = sim.adversary_view()
        per_relay = [relay_mapping_entropy(view, r) for r in range(nodes)]
        out["h_relay_loc_mean_bits"] = sum(e.mean_bits for e in per_relay) / nodes
        out["h_relay_loc_mean_candidates"] = sum(e.mean_candidates for e in per_relay) / nodes
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--fragments", type=int, default=7, help="fragments per neighbour per round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cover-policy", default="data", choices=("data", "own", "all"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-nodes", type=int, default=100, help="N of the separate peak-memory run (0: skip)")
    parser.add_argument("--json", action="store_true", help="print one JSON line only (used for the memory run)")
    parser.add_argument("--keep", help="also write the report as Markdown here (docs/mixnet.md includes "
                                       "results_bench/mixnet_simulation_speed.md)")
    args = parser.parse_args()
    lines: list[str] = []

    def say(text: str) -> None:
        lines.append(text)
        print(text)

    result = run(args.nodes, args.fragments, args.rounds, args.cover_policy, args.seed, entropy=not args.json)
    if args.json:
        print(json.dumps(result))
        return
    speed = result["virtual_s"] / result["wall_s"]
    wall_per_round = result["wall_s"] / args.rounds
    say(f"N={args.nodes} K=2 O=100 mu=0.1 sigma=0.001 cover={args.cover_policy}, "
          f"{args.fragments} fragments x 4 neighbours per node per round, {args.rounds} round(s); "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    say(f"virtual time {result['virtual_s']:.2f} s (batch delivered in "
          f"{', '.join(f'{t:.2f}' for t in result['batch_virtual_s'])} s), wall {result['wall_s']:.2f} s, "
          f"process CPU {result['cpu_s']:.2f} s")
    say(f"speed: {speed:.3f} virtual s per wall s ({result['virtual_s'] / result['cpu_s']:.3f} per CPU s)  "
          f"ratio to target ({TARGET_SPEEDUP:.0f}x real time) {speed / TARGET_SPEEDUP:.4f}")
    say(f"wall per round {wall_per_round:.2f} s vs paper prototype ~{PAPER_WALL_PER_ROUND_S:.0f} s: "
          f"{PAPER_WALL_PER_ROUND_S / wall_per_round:.1f}x faster "
          f"({PAPER_WALL_PER_ROUND_S * args.rounds / result['cpu_s']:.1f}x per CPU s)")
    say(f"packets sent by kind: {result['packets']}  ({result['bytes_sent'] / 2**20:.1f} MiB), "
          f"undelivered {result['undelivered']}, CPU per node {result['cpu_s_per_node']:.3f} s")
    # The floor: the Sphinx work this round needs, priced at Nym's Rust rates (one core). Every packet a
    # node receives is one unwrap; every packet a node originates (real, cover, retransmission) is one
    # creation (its SURB, another header, is not even counted). Acks reuse a SURB: no creation.
    created = sum(result["packets"][k] for k in ("real", "cover", "retransmission") if k in result["packets"])
    floor_s = result["unwraps"] / NYM_UNWRAPS_PER_S + created / NYM_CREATIONS_PER_S
    say(f"Sphinx work: {result['unwraps']} unwraps + {created} creations; at Nym's Rust rates "
          f"({NYM_UNWRAPS_PER_S:.0f} unwraps/s, {NYM_CREATIONS_PER_S:.0f} creations/s per core) that alone is "
          f"{floor_s:.2f} s of one core: at most {result['virtual_s'] / floor_s:.2f}x real time on one core, "
          f"{result['virtual_s'] / floor_s * (os.cpu_count() or 1):.2f}x on {os.cpu_count()} perfectly used cores")
    say(f"entropy: H_relay = log2 O = {h_relay(100):.2f} bits, H_path(K=2) = {h_path(100, 2):.2f} bits, "
          f"measured H_relay^loc mean {result['h_relay_loc_mean_bits']:.2f} bits over "
          f"{result['h_relay_loc_mean_candidates']:.1f} timing candidates")
    say(f"peak RSS (N={args.nodes}): {result['peak_rss_mib']:.0f} MiB")
    if args.memory_nodes:
        cmd = [sys.executable, __file__, "--nodes", str(args.memory_nodes), "--fragments", str(args.fragments),
               "--cover-policy", args.cover_policy, "--memory-nodes", "0", "--json"]
        big = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())
        say(f"N={args.memory_nodes}: peak RSS {big['peak_rss_mib']:.0f} MiB, wall {big['wall_s']:.2f} s "
              f"(CPU {big['cpu_s']:.2f} s) for "
              f"{big['virtual_s']:.2f} virtual s ({big['virtual_s'] / big['wall_s']:.3f}x real time), "
              f"undelivered {big['undelivered']}")

    if args.keep:
        from flower_apps.common.results import atomic_write_text

        command = " ".join(["python benchmarks/mixnet_simulation_speed.py", *sys.argv[1:]]).split(" --keep")[0]
        atomic_write_text(args.keep, "```text\n$ " + command + "\n" + "\n".join(lines) + "\n```\n")


if __name__ == "__main__":
    main()
