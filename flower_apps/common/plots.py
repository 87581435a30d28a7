"""Matplotlib helpers (Agg backend, atomic PNG writes)."""

from __future__ import annotations

import io
from pathlib import Path

from flower_apps.common.results import atomic_write_bytes


def save_fig(fig, path: str | Path, dpi: int = 120) -> None:
    """Render ``fig`` to PNG in memory and write it atomically; closes the figure."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
