"""Transport-only experiments: one round of fragment traffic through the mixnet, then measure it.

The learning layer does not change what the network sees (every fragment is one
same-size Sphinx packet), so the network-layer experiments replay the study's traffic
pattern without training: each node sends ``F`` one-packet fragments to each learning
neighbour at the start of a round. Measured per configuration: the passive adversary's
sender-linking scores (flow correlation, trace-consistent candidate sets), the entropy
metrics (H_relay, H_path, the trace-based H_relay^loc), round-trip time, CPU time and
bytes per node, and the simulation process's peak memory (each configuration runs in a
fresh process so that ``ru_maxrss`` is its own).
"""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from attacks.linking.scoring import fragment_targets, score_linking
from attacks.linking.timing import flow_correlation_attack
from attacks.linking.trajectories import trajectory_counts
from mixnet import MixnetConfig, Simulator
from mixnet.messages import fragment_capacity
from mixnet.metrics import h_path, h_relay, relay_mapping_entropy, relay_min_entropy
from mixnet.theory import ideal_relay_min_entropy, path_length_prior, theory_row
from mixnet.theory_multiplicity import multiplicity_row
from registry import streams

COMPROMISED = (0.1, 0.25)  # fractions of colluding relays in our chain-following bound, beside the measurement

MAX_TARGETS = 600  # attributed frames per configuration (a seeded sample when more)


@dataclass(frozen=True)
class TrafficSpec:
    """One transport configuration to measure."""

    num_nodes: int = 16
    degree: int = 4
    topology: str = "circulant"
    fragments_per_peer: int = 7
    rounds: int = 1
    mixnet: bool = True
    max_hops: int = 2
    outbox: int = 100
    mu: float = 0.1
    cover: bool = True
    latency: float = 0.005
    seed: int = 0

    def config(self) -> MixnetConfig:
        if self.mixnet:
            return MixnetConfig(max_path_length=self.max_hops, outbox_size=self.outbox, mu=self.mu,
                                cover_traffic=self.cover)
        return MixnetConfig(max_path_length=1, outbox_size=1, mu=1e-3, sigma=0.0, cover_traffic=False)

    @property
    def label(self) -> str:
        return f"K={self.max_hops}, O={self.outbox}, mu={self.mu:g}" if self.mixnet else "mixnet off"


def run_traffic(spec: TrafficSpec) -> tuple[Simulator, list[bytes], float]:
    """Simulate ``spec.rounds`` rounds of fragment traffic; returns (simulator, message ids, CPU seconds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = Simulator(spec.config(), spec.num_nodes, seed=spec.seed, topology=spec.topology, degree=spec.degree,
                        latency=spec.latency)
    rng = random.Random(f"{spec.seed}/payload")
    size = fragment_capacity(sim.config.packet_format)
    ids: list[bytes] = []
    c0 = time.process_time()
    for _ in range(spec.rounds):
        for i in range(spec.num_nodes):
            for j in sim.topology.neighbours(i):
                for _ in range(spec.fragments_per_peer):
                    ids.append(sim.send(i, j, rng.randbytes(size)))
        sim.run_until_idle()
    return sim, ids, time.process_time() - c0


def linking_scores(sim: Simulator, ids: list[bytes], seed: int = 0) -> dict[str, float]:
    """Flow-correlation attack on the trace, topology-agnostic and topology-aware, with the theory beside it.

    Theory, per variant: our chain-following bound (``mixnet.theory``, not the paper's Theorem 1) with
    the ideal ``H_inf = log2 O`` (``*_ideal_*``) and with the trace's average relay min-entropy
    (``*_trace_*``), with colluding relays at the ``COMPROMISED`` fractions; the multiplicity form
    (``mixnet.theory_multiplicity``, issue 39's reading of the paper: feasible trajectories times
    ``2^-H_inf``, ``*_{ideal,trace}_mult_*``); and the sender posterior's average min-entropy
    ``-log2 E[max_s P(s | view)]`` (``*_sender_h_inf_bits``).
    """
    view, truth = sim.adversary_view(), sim.ground_truth()
    records = sim.message_records()
    pairs = {(records[m].src, records[m].dst) for m in ids}
    targets = fragment_targets(view, truth, pairs)
    if len(targets) > MAX_TARGETS:
        pick = streams.rng("unlinkable-dfl.linking-targets", seed).choice(len(targets), MAX_TARGETS, replace=False)
        targets = [targets[k] for k in sorted(pick)]
    frames = [t.frame for t in targets]
    cfg = sim.config
    prior = path_length_prior(cfg.max_path_length, cfg.path_length_weights)
    relay = relay_min_entropy(view, truth=truth)
    out: dict[str, float] = {"relay_h_inf_bits": relay.h_inf_bits, "relay_guess_probability": relay.guess_probability,
                             "relay_outputs_scored": relay.outputs,
                             "ideal_h_inf_bits": ideal_relay_min_entropy(cfg.outbox_size)}
    # The topology-aware adversary knows fragments come from the receiver's neighbours: its relay
    # posterior is conditioned on that too (H_inf can only drop), or its bound would not hold.
    aware_relay = relay_min_entropy(view, truth=truth, topology=view.neighbours())
    out["aware_relay_h_inf_bits"] = aware_relay.h_inf_bits
    h_trace = {"agnostic": relay.h_inf_bits, "aware": aware_relay.h_inf_bits}
    for name, nbrs in (("agnostic", None), ("aware", view.neighbours())):
        guesses = flow_correlation_attack(view, frames, nbrs, streams.rng("unlinkable-dfl.flow-correlation", seed))
        for k, v in score_linking(guesses, targets).as_dict().items():
            out[f"{name}_{k}"] = v
        if not guesses:
            continue
        sizes = [max(1, len(g.anonymity)) for g in guesses]
        out.update(theory_row(out["ideal_h_inf_bits"], prior, sizes, COMPROMISED).as_dict(f"{name}_ideal"))
        out.update(theory_row(h_trace[name], prior, sizes, COMPROMISED).as_dict(f"{name}_trace"))
        counts = trajectory_counts(view, guesses)
        sender = {t.frame: t.sender for t in targets}
        hits = [float(g.guess == sender[g.target]) for g in guesses]
        base = [1.0 / s for s in sizes]
        for h, tag in ((out["ideal_h_inf_bits"], "ideal"), (h_trace[name], "trace")):
            out.update(multiplicity_row(counts, h, hits, base).as_dict(f"{name}_{tag}"))
        guess_p = float(np.mean([g.posterior for g in guesses]))
        out[f"{name}_sender_h_inf_bits"] = float(-np.log2(guess_p)) if guess_p > 0 else float("inf")
    return out


def _peak_rss_kib() -> float:
    """This process's peak resident set (KiB): VmHWM on Linux (``ru_maxrss`` survives exec there)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def measure(spec: TrafficSpec, entropy_relays: int = 8) -> dict[str, Any]:
    """Everything the trade-off and linking tables report for one configuration."""
    rss0 = _peak_rss_kib()
    t0 = time.perf_counter()
    sim, ids, cpu = run_traffic(spec)
    wall = time.perf_counter() - t0
    rss1 = _peak_rss_kib()
    records = sim.message_records()
    stats = sim.node_stats()
    n = spec.num_nodes
    # cast: mypy does not narrow records[m].acked (an index expression) by the filter
    rtt = [cast(float, records[m].acked) - records[m].sent for m in ids if records[m].acked is not None]
    delivered = [m for m in ids if records[m].delivered is not None]
    row: dict[str, Any] = {  # numbers, plus the label, topology and mixnet flag
        "label": spec.label, "num_nodes": n, "degree": spec.degree, "topology": spec.topology,
        "mixnet": spec.mixnet, "max_hops": spec.max_hops if spec.mixnet else 1,
        "outbox": spec.outbox if spec.mixnet else 1, "mu": spec.mu if spec.mixnet else 0.0, "seed": spec.seed,
        "fragments": len(ids), "completeness": len(delivered) / len(ids) if ids else 1.0,
        "round_virtual_s": sim.batch_delivery_time(ids) if len(delivered) == len(ids) else float("nan"),
        "rtt_s_mean": float(np.mean(rtt)) if rtt else float("nan"),
        "rtt_s_p95": float(np.percentile(rtt, 95)) if rtt else float("nan"),
        "cpu_s_per_node": sum(s.cpu_time_s for s in stats.values()) / n / spec.rounds,
        "bytes_per_node": sum(s.total_bytes_sent for s in stats.values()) / n / spec.rounds,
        "cover_packets_per_node": sum(s.packets_sent["cover"] for s in stats.values()) / n / spec.rounds,
        "sim_wall_s": wall, "sim_cpu_s": cpu,
        "peak_rss_mib": rss1 / 1024.0, "rss_growth_mib": (rss1 - rss0) / 1024.0,
        "h_relay_bits": h_relay(spec.outbox) if spec.mixnet else 0.0,
        "h_path_bits": h_path(spec.outbox, spec.max_hops) if spec.mixnet else 0.0,
    }
    view = sim.adversary_view()
    relays = random.Random(spec.seed).sample(range(n), min(entropy_relays, n))
    ent = [relay_mapping_entropy(view, r) for r in relays]
    ent = [e for e in ent if e.outputs]
    row["h_relay_loc_bits"] = float(np.mean([e.mean_bits for e in ent])) if ent else 0.0
    row["relay_candidates"] = float(np.mean([e.mean_candidates for e in ent])) if ent else 0.0
    row.update(linking_scores(sim, ids, spec.seed))
    return row


def measure_isolated(specs: list[TrafficSpec]) -> list[dict[str, float]]:
    """:func:`measure` each spec in a fresh interpreter that imports only the network code,
    so that ``rss_growth_mib`` is the simulation's own memory (all N nodes)."""
    out = []
    for spec in specs:
        proc = subprocess.run([sys.executable, "-m", "flower_apps.unlinkable_dfl.netexp", json.dumps(asdict(spec))],
                              capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parents[2])
        if proc.returncode != 0:
            raise RuntimeError(f"transport measurement {spec} failed:\n{proc.stderr[-2000:]}")
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


if __name__ == "__main__":
    print(json.dumps(measure(TrafficSpec(**json.loads(sys.argv[1])))))
