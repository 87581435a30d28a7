"""Figures for dfl-dp (placeholder module filled below)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_class_counts(counts: np.ndarray, path: Path) -> None:
    """Stacked bars of per-client class counts (the seed paper's Figure 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flower_apps.common.plots import save_fig

    fig, ax = plt.subplots(figsize=(max(6, counts.shape[0] * 0.08), 3.2))
    bottom = np.zeros(counts.shape[0])
    cmap = plt.get_cmap("tab10")
    for k in range(counts.shape[1]):
        ax.bar(np.arange(counts.shape[0]), counts[:, k], bottom=bottom, width=0.9, color=cmap(k % 10), label=str(k))
        bottom += counts[:, k]
    ax.set_xlabel("client")
    ax.set_ylabel("samples")
    ax.set_title("Per-client class counts (Dirichlet label skew)")
    ax.legend(title="class", ncol=5, fontsize=7, loc="upper right")
    save_fig(fig, path)
