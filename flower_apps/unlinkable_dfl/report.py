"""Tables (CSV + Markdown) and figures of each UnlinkableDFL experiment, from finished results.

Every table cell over seeds is ``mean +- SD [95% t-interval]`` (one seed: the value).
The paper's reported numbers are listed beside ours in docs/unlinkable_dfl.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from flower_apps.common.plots import save_fig, subplots
from flower_apps.common.results import atomic_write_text
from flower_apps.common.tables import group_by, seed_cell, write_table
from flower_apps.unlinkable_dfl.payload import payload_rows

TRANSPORT_LABEL = {"mixnet": "mixnet on", "direct": "mixnet off", "baseline": "baseline (non-anonymous DFL)"}


def _group(items: list[dict], key: Callable[[dict], tuple]) -> dict[tuple, list[dict]]:
    """:func:`group_by`, groups sorted by key (None sorts as the string 'None')."""
    return dict(sorted(group_by(items, key).items(), key=lambda kv: tuple(str(x) if x is None else x for x in kv[0])))


def _cell(runs: list[dict], key: str | Callable[[dict], float | None], scale: float = 1.0, digits: int = 3) -> str:
    return seed_cell([(key(r) if callable(key) else r.get(key)) for r in runs], digits, scale)


def _mean(runs: list[dict], key: str | Callable[[dict], float | None]) -> float:
    vals = [(key(r) if callable(key) else r.get(key)) for r in runs]
    finite = [float(v) for v in vals if v is not None and np.isfinite(float(v))]
    return float(np.mean(finite)) if finite else float("nan")


def _lines(groups: dict, x_of, y_of, series_of, path: Path, xlabel: str, ylabel: str, title: str,
           logx: bool = False) -> None:
    fig, ax = subplots(figsize=(5.5, 3.6))
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for k, runs in groups.items():
        series[series_of(k)].append((x_of(k), _mean(runs, y_of)))
    for name, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    save_fig(fig, path)


def _curves(groups: dict, label_of, path: Path, title: str) -> None:
    fig, ax = subplots(figsize=(5.5, 3.6))
    for k, runs in groups.items():
        t = min(len(r["acc_curve"]) for r in runs)
        arr = np.asarray([r["acc_curve"][:t] for r in runs])
        ax.plot(np.arange(1, t + 1), arr.mean(0), marker=".", label=label_of(k))
    ax.set_xlabel("round")
    ax.set_ylabel("mean test accuracy (live honest nodes)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    save_fig(fig, path)


def _acc_cols(runs: list[dict]) -> dict:
    return {"seeds": len(runs), "final acc (%)": _cell(runs, "final_acc", 100, 2),
            "best acc (%)": _cell(runs, "best_acc", 100, 2)}


def _scaling(s: list[dict], out: Path) -> str:
    g = _group(s, lambda r: (r["num_nodes"], r["transport"]))
    rows = [{"N": k[0], "transport": TRANSPORT_LABEL[k[1]], **_acc_cols(v),
             "completeness (%)": _cell(v, "mean_completeness", 100, 1), "coverage (%)": _cell(v, "mean_coverage", 100, 1)}
            for k, v in g.items()]
    _lines(g, lambda k: k[0], "final_acc", lambda k: TRANSPORT_LABEL[k[1]], out / "figure_scaling_accuracy.png",
           "N (nodes)", "final test accuracy", "Utility vs N (mean over live nodes)")
    return write_table(rows, out / "table_scaling", "Experiment 1: utility vs N, mixnet on/off and the baseline")


def _cost(s: list[dict], traffic: list[dict], out: Path) -> str:
    md = ""
    if s:
        g = _group(s, lambda r: (r["transport"],))
        rows = [{"transport": TRANSPORT_LABEL[k[0]], "N": v[0]["num_nodes"], "seeds": len(v),
                 "CPU s/node/round": _cell(v, "mean_cpu_s_per_node", 1, 3),
                 "mixnet CPU s/node/round": _cell(v, "mean_mixnet_cpu_s_per_node", 1, 3),
                 "round duration s (train + virtual network + aggregate)": _cell(v, "mean_round_virtual_s", 1, 2),
                 "virtual network s": _cell(v, "mean_network_virtual_s", 1, 2),
                 "MB sent/node/round": _cell(v, "mean_bytes_per_node", 1e-6, 2),
                 "meaningful packets/node/round": _cell(v, "mean_meaningful_packets_per_node", 1, 1),
                 "final acc (%)": _cell(v, "final_acc", 100, 2)} for k, v in g.items()]
        md += write_table(rows, out / "table_cost", "Experiment 2: cost per node and round, mixnet on vs off")
        fig, axes = subplots(1, 3, figsize=(9, 3.2))
        labels = [TRANSPORT_LABEL[k[0]].split(" (")[0] for k in g]
        for ax, key, ylabel, scale in zip(axes, ("mean_cpu_s_per_node", "mean_round_virtual_s", "mean_bytes_per_node"),
                                          ("CPU s / node / round", "round duration (s)", "MB / node / round"),
                                          (1, 1, 1e-6)):
            ax.bar(range(len(g)), [_mean(v, key) * scale for v in g.values()])
            ax.set_xticks(range(len(g)))
            ax.set_xticklabels(labels, fontsize=7, rotation=20)
            ax.set_ylabel(ylabel)
        save_fig(fig, out / "figure_cost.png")
    if traffic:
        md += "\n" + _tradeoff(traffic, out, "table_tradeoff",
                                "Experiment 2: trade-off over K, O and mu (cf. paper Table IV)")
    return md


def _tradeoff(traffic: list[dict], out: Path, stem: str, title: str) -> str:
    g = _group(traffic, lambda r: (r["label"], r["num_nodes"]))
    rows = []
    for (label, n), v in g.items():
        rows.append({"config": label, "N": n, "seeds": len(v),
                     "H_relay (bits)": f"{v[0]['h_relay_bits']:.2f}", "H_path (bits)": f"{v[0]['h_path_bits']:.2f}",
                     "H_relay^loc (bits)": "-" if not v[0]["mixnet"] else _cell(v, "h_relay_loc_bits", 1, 2),
                     "RTT mean (s)": _cell(v, "rtt_s_mean", 1, 3), "round (virtual s)": _cell(v, "round_virtual_s", 1, 2),
                     "CPU s/node": _cell(v, "cpu_s_per_node", 1, 3), "MB/node": _cell(v, "bytes_per_node", 1e-6, 2),
                     "cover pkts/node": _cell(v, "cover_packets_per_node", 1, 0),
                     "peak RSS (MiB, all N nodes)": _cell(v, "peak_rss_mib", 1, 0),
                     "RSS growth in the round (MiB)": _cell(v, "rss_growth_mib", 1, 1),
                     "completeness (%)": _cell(v, "completeness", 100, 1)})
    return write_table(rows, out / stem, title)


def _payload(s: list[dict], out: Path) -> str:
    rows = []
    for r in payload_rows():
        rows.append({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()})
    md = write_table(rows, out / "table_payload",
                     "Experiment 3: fragments and bytes per update and round (degree 4, r = 1)")
    if s:
        g = _group(s, lambda r: (r["encoding"],))
        enc_label = {"q8": "8-bit + zlib", "float32": "32-bit + zlib"}
        acc = [{"encoding": enc_label[k[0]], "transport": TRANSPORT_LABEL[v[0]["transport"]],
                **_acc_cols(v), "meaningful packets/node/round": _cell(v, "mean_meaningful_packets_per_node", 1, 1),
                "MB sent/node/round": _cell(v, "mean_bytes_per_node", 1e-6, 2)} for k, v in g.items()]
        md += "\n" + write_table(acc, out / "table_payload_accuracy", "Experiment 3: 8-bit vs 32-bit accuracy")
        fig, ax = subplots(figsize=(5.5, 3.4))
        models = sorted({r["model"] for r in rows})
        for j, enc in enumerate(("32-bit", "8-bit")):
            counts = [next(r["fragments"] for r in rows if r["model"] == m and r["encoding"] == enc) for m in models]
            ax.bar(np.arange(len(models)) + 0.4 * j, counts, width=0.4, label=enc)
        ax.set_xticks(np.arange(len(models)) + 0.2)
        ax.set_xticklabels(models)
        ax.set_yscale("log")
        ax.set_ylabel("fragments (Sphinx packets) per update")
        ax.legend()
        save_fig(fig, out / "figure_payload_fragments.png")
    return md


def _partial(s: list[dict], out: Path) -> str:
    g = _group(s, lambda r: (r["share_ratio"],))
    rows = [{"r": k[0], **_acc_cols(v), "coverage (%)": _cell(v, "mean_coverage", 100, 1),
             "MB sent/node/round": _cell(v, "mean_bytes_per_node", 1e-6, 2),
             "meaningful packets/node/round": _cell(v, "mean_meaningful_packets_per_node", 1, 1)} for k, v in g.items()]
    _lines(g, lambda k: k[0], "final_acc", lambda k: "FragFedAvg, mixnet on", out / "figure_partial_accuracy.png",
           "share ratio r", "final test accuracy", "Partial exchange")
    return write_table(rows, out / "table_partial", "Experiment 4: partial exchange (share ratio r)")


def _churn(s: list[dict], out: Path) -> str:
    g = _group(s, lambda r: (r["churn_leave"], r["churn_join"]))
    rows = [{"leave prob./round": k[0], "join prob./round": k[1], **_acc_cols(v),
             "completeness (%)": _cell(v, "mean_completeness", 100, 1), "coverage (%)": _cell(v, "mean_coverage", 100, 1),
             "mean live nodes": _cell(v, lambda r: r.get("mean_live_nodes"), 1, 1)} for k, v in g.items()]
    _curves(g, lambda k: f"leave {k[0]:g}, join {k[1]:g}", out / "figure_churn_curves.png", "Churn")
    return write_table(rows, out / "table_churn", "Experiment 5: churn")


def _byzantine(s: list[dict], out: Path) -> str:
    g = _group(s, lambda r: (r["byzantine_fraction"], r["byzantine_attack"] if r["byzantine_fraction"] else "-",
                             r["aggregator"]))
    rows = [{"Byzantine fraction": k[0], "attack": k[1], "aggregator": {"fedavg": "FragFedAvg", "krum": "FragKrum"}[k[2]],
             "B_r": v[0]["krum_budget"] if k[2] == "krum" else "-", **_acc_cols(v),
             "Krum ranges": int(_mean(v, "krum_ranges")), "fallback ranges": int(_mean(v, "krum_fallback_ranges"))}
            for k, v in g.items()]
    fig, ax = subplots(figsize=(6, 3.4))
    labels = [f"f={k[0]:g} {k[1]}\n{'Krum' if k[2] == 'krum' else 'FedAvg'}" for k in g]
    ax.bar(range(len(g)), [_mean(v, "final_acc") for v in g.values()])
    ax.set_xticks(range(len(g)))
    ax.set_xticklabels(labels, fontsize=6)
    ax.set_ylabel("final accuracy (honest nodes)")
    save_fig(fig, out / "figure_byzantine.png")
    return write_table(rows, out / "table_byzantine", "Experiment 6: Byzantine fragments (N = 20, full mesh)")


def _linking(traffic: list[dict], out: Path) -> str:
    g = _group(traffic, lambda r: (not r["mixnet"], r["max_hops"], r["outbox"], r["mu"], r["num_nodes"]))
    rows = []
    for k, v in g.items():
        row = {"config": v[0]["label"], "N": k[4], "seeds": len(v), "targets": int(_mean(v, "agnostic_targets"))}
        for adv in ("agnostic", "aware"):
            row[f"{adv}: accuracy"] = _cell(v, f"{adv}_accuracy", 1, 3)
            row[f"{adv}: 1/#U_T"] = _cell(v, f"{adv}_baseline", 1, 3)
            row[f"{adv}: advantage"] = _cell(v, f"{adv}_advantage", 1, 3)
            row[f"{adv}: mean #C_T"] = _cell(v, f"{adv}_mean_candidates", 1, 2)
        row["exposed (#C_T = 1)"] = _cell(v, "agnostic_exposed", 1, 3)
        row["H_relay"] = f"{v[0]['h_relay_bits']:.2f}"
        row["H_path"] = f"{v[0]['h_path_bits']:.2f}"
        row["H_relay^loc"] = "-" if not v[0]["mixnet"] else _cell(v, "h_relay_loc_bits", 1, 2)
        rows.append(row)
    fig, ax = subplots(figsize=(6.5, 3.6))
    x = np.arange(len(g))
    for j, adv in enumerate(("agnostic", "aware")):
        ax.bar(x + 0.4 * j, [_mean(v, f"{adv}_accuracy") for v in g.values()], width=0.4, label=f"{adv} accuracy")
        ax.scatter(x + 0.4 * j, [_mean(v, f"{adv}_baseline") for v in g.values()], color="k", marker="_", s=200,
                   zorder=3, label="1/|U_T|" if j == 0 else None)
    ax.set_xticks(x + 0.2)
    ax.set_xticklabels([v[0]["label"] for v in g.values()], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("sender identification accuracy")
    ax.legend(fontsize=7)
    save_fig(fig, out / "figure_linking.png")
    md = write_table(rows, out / "table_linking", "Experiment 7: sender linking by a passive global adversary")
    theory = {k: v for k, v in g.items() if all("agnostic_trace_bound" in r for r in v)}
    return md + ("\n" + _linking_theory(theory, out) if theory else "")


THEORY_C = 0.25  # our chain-following bound with colluding relays drawn at this fraction


def _within(runs: list[dict], adv: str, bound: str) -> str:
    """Every seed's measured advantage against its own bound ("-" when a seed lacks it; a violation shows)."""
    if any(r.get(adv) is None or r.get(bound) is None for r in runs):
        return "-"
    pairs = [(float(r[adv]), float(r[bound])) for r in runs]
    if not all(np.isfinite(a) and np.isfinite(b) for a, b in pairs):
        return "-"
    return "yes" if all(a <= b + 1e-9 for a, b in pairs) else "**NO**"


def _linking_theory(g: dict, out: Path) -> str:
    """Theory beside measurement: our chain-following bound and the multiplicity form vs the measured advantage.

    Neither column is the paper's Theorem 1 as the paper states it (its text was not readable here):
    "chain" is ours (``mixnet.theory``), "multiplicity" is issue 39's reading of the paper's
    ``gamma_T`` (``mixnet.theory_multiplicity``); docs/unlinkable_dfl.md, "Which formula".
    """
    rows = []
    for v in g.values():
        row = {"config": v[0]["label"], "N": v[0]["num_nodes"], "seeds": len(v),
               "H_inf ideal (log2 O)": f"{v[0]['ideal_h_inf_bits']:.2f}",
               "H_inf trace": _cell(v, "relay_h_inf_bits", 1, 2)}
        for adv in ("agnostic", "aware"):
            row[f"{adv}: sender H_inf"] = _cell(v, f"{adv}_sender_h_inf_bits", 1, 2)
            row[f"{adv}: advantage"] = _cell(v, f"{adv}_advantage", 1, 3)
            row[f"{adv}: chain gamma_T (ours, trace)"] = _cell(v, f"{adv}_trace_gamma", 1, 3)
            row[f"{adv}: chain bound (ours), ideal H_inf"] = _cell(v, f"{adv}_ideal_bound", 1, 3)
            row[f"{adv}: chain bound (ours), trace H_inf"] = _cell(v, f"{adv}_trace_bound", 1, 3)
            row[f"{adv}: chain bound (ours), c={THEORY_C:g}"] = _cell(v, f"{adv}_trace_bound_c{THEORY_C:g}", 1, 3)
            # every seed's measured advantage against its own bound (a violation of ours is a bug)
            row[f"{adv}: within chain bound"] = _within(v, f"{adv}_advantage", f"{adv}_trace_bound")
            row[f"{adv}: mean |Gamma_T|"] = _cell(v, f"{adv}_trace_mult_trajectories", 1, 1)
            row[f"{adv}: multiplicity gamma_T (trace)"] = _cell(v, f"{adv}_trace_mult_bound", 1, 3)
            row[f"{adv}: within multiplicity"] = _within(v, f"{adv}_advantage", f"{adv}_trace_mult_bound")
            row[f"{adv}: targets with multiplicity gamma_T < 1"] = _cell(v, f"{adv}_trace_mult_informative", 1, 3)
            row[f"{adv}: advantage on them"] = _cell(v, f"{adv}_trace_mult_informative_advantage", 1, 3)
            row[f"{adv}: their mean gamma_T"] = _cell(v, f"{adv}_trace_mult_informative_bound", 1, 3)
            row[f"{adv}: within on them"] = _within(v, f"{adv}_trace_mult_informative_advantage",
                                                    f"{adv}_trace_mult_informative_bound")
        rows.append(row)
    fig, axes = subplots(1, 2, figsize=(10, 3.8), sharey=True)
    x = np.arange(len(g))
    labels = [v[0]["label"] for v in g.values()]
    for ax, adv in zip(axes, ("agnostic", "aware")):
        ax.bar(x, [_mean(v, f"{adv}_advantage") for v in g.values()], width=0.6, color="tab:blue",
               label="measured advantage")
        for key, style, name in ((f"{adv}_trace_bound", "v", "chain-following bound (ours), trace H_inf"),
                                 (f"{adv}_ideal_bound", "_", "chain-following bound (ours), H_inf = log2 O"),
                                 (f"{adv}_trace_bound_c{THEORY_C:g}", "^", f"chain-following (ours), c = {THEORY_C:g}"),
                                 (f"{adv}_trace_mult_bound", "x", "multiplicity form (issue 39's reading), trace")):
            ax.scatter(x, [min(_mean(v, key), 1.05) for v in g.values()], marker=style, s=60, zorder=3, label=name)
        ax.set_ylim(0, 1.1)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_title(f"topology-{adv} adversary (multiplicity form drawn at <= 1.05)", fontsize=8)
    axes[0].set_ylabel("sender-linking advantage over 1/|U_T|")
    axes[1].legend(fontsize=6)
    save_fig(fig, out / "figure_linking_theory.png")
    return write_table(rows, out / "table_linking_theory",
                       "Experiment 7b: measured sender-linking advantage beside our chain-following bound and the "
                       "multiplicity form of gamma_T (issue 39's reading of the paper's Theorem 1)")


def _content(s: list[dict], out: Path) -> str:
    g = _group(s, lambda r: (r["alpha"], r["share_ratio"]))
    rows = [{"alpha": k[0], "r": k[1], "seeds": len(v),
             "identity linking": _cell(v, lambda r: r["content_linking"]["identity_accuracy"], 1, 3),
             "bucket tracking": _cell(v, lambda r: r["content_linking"]["bucket_accuracy"], 1, 3),
             "chance (1/senders)": _cell(v, lambda r: r["content_linking"]["chance"], 1, 3),
             "fragments scored": int(_mean(v, lambda r: r["content_linking"]["fragments"])),
             "final acc (%)": _cell(v, "final_acc", 100, 2)} for k, v in g.items()]
    _lines(g, lambda k: k[1], lambda r: r["content_linking"]["identity_accuracy"], lambda k: f"alpha={k[0]:g}",
           out / "figure_content_linking.png", "share ratio r", "identity-linking accuracy",
           "Curious-recipient content linking", logx=True)
    return write_table(rows, out / "table_content_linking", "Experiment 8: curious-recipient content linking")


def _topology(s: list[dict], traffic: list[dict], out: Path) -> str:
    """Supplement: accuracy and sender linking vs the learning graph's degree."""
    g = _group(s, lambda r: (r["num_nodes"] - 1 if r["topology"] == "full-mesh" else r.get("degree", 4), r["topology"]))
    rows = [{"topology": k[1], "degree": k[0], **_acc_cols(v),
             "completeness (%)": _cell(v, "mean_completeness", 100, 1),
             "MB sent / node / round": _cell(v, "mean_bytes_per_node", 1e-6, 2)} for k, v in g.items()]
    md = (write_table(rows, out / "table_topology_accuracy", "Supplement: accuracy vs graph degree (mixnet on)")
          if rows else "")
    if g:
        _lines(g, lambda k: k[0], "final_acc", lambda k: "mixnet on", out / "figure_topology_accuracy.png",
               "degree (neighbours per node)", "final test accuracy", "Utility vs graph degree")
    t = _group(traffic, lambda r: (r.get("degree", 0),))
    trows = []
    for k, v in t.items():
        row = {"degree": k[0], "N": v[0]["num_nodes"], "config": v[0]["label"], "seeds": len(v)}
        for adv in ("agnostic", "aware"):
            row[f"{adv}: accuracy"] = _cell(v, f"{adv}_accuracy", 1, 3)
            row[f"{adv}: 1/#U_T"] = _cell(v, f"{adv}_baseline", 1, 3)
            row[f"{adv}: advantage"] = _cell(v, f"{adv}_advantage", 1, 3)
            row[f"{adv}: chain bound (ours), trace"] = _cell(v, f"{adv}_trace_bound", 1, 3)
        trows.append(row)
    if trows:
        md += "\n" + write_table(trows, out / "table_topology_linking", "Supplement: sender linking vs graph degree")
        _lines({k: v for k, v in t.items()}, lambda k: k[0], "aware_advantage", lambda k: "topology-aware advantage",
               out / "figure_topology_linking.png", "degree", "sender-linking advantage", "Linking vs graph degree")
    return md


def write_report(experiment: str, scale: str, summaries: list[dict], traffic: list[dict], root: Path,
                 label: str | None = None) -> str:
    """Write the experiment's tables and figures under ``root/<label>/`` (default ``<experiment>-<scale>``)."""
    out = root / (label or f"{experiment}-{scale}")
    out.mkdir(parents=True, exist_ok=True)
    if not summaries and not traffic and experiment != "payload":
        raise FileNotFoundError(f"no finished results for experiment {experiment!r} under {root}")
    fn = {"scaling": lambda: _scaling(summaries, out), "cost": lambda: _cost(summaries, traffic, out),
          "payload": lambda: _payload(summaries, out), "partial": lambda: _partial(summaries, out),
          "churn": lambda: _churn(summaries, out), "byzantine": lambda: _byzantine(summaries, out),
          "linking": lambda: _linking(traffic, out), "content": lambda: _content(summaries, out),
          "topology": lambda: _topology(summaries, traffic, out)}[experiment]
    md = fn()
    notes = sorted({n for s in summaries for n in s.get("data_notes", [])})
    if notes:
        md += "\nData: " + " ".join(f"- {n}" for n in notes) + "\n"
    atomic_write_text(out / "report.md", md)
    return md
