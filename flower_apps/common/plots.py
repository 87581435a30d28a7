"""Matplotlib helpers: figures on the Agg canvas (no global backend switch), atomic PNG writes.

Figures are built with :class:`matplotlib.figure.Figure` directly, as
``attacks/inversion/figures.py`` does, so plotting never calls ``matplotlib.use`` and never
touches pyplot's global figure registry.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from flower_apps.common.results import atomic_write_bytes


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None, **kw: Any):
    """``(figure, axes)`` like ``pyplot.subplots``, on a figure pyplot does not manage."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def colormap(name: str):
    """A registered colormap by name (``tab10``, ``viridis``...)."""
    import matplotlib

    return matplotlib.colormaps[name]


def integer_ticks():
    """A tick locator that puts ticks on integers only (rounds, epochs)."""
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def save_fig(fig, path: str | Path, dpi: int = 120) -> None:
    """Render ``fig`` to PNG in memory and write it atomically (closed if pyplot manages it)."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi)
    if fig.canvas.manager is not None:  # made by pyplot: let pyplot forget it
        import matplotlib.pyplot as plt

        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
