"""Figure-8-style grid of reconstructions: rows (framework, condition), columns original + attacks."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

from attacks.inversion.metrics import unnormalize


@dataclass(frozen=True)
class GridRow:
    """One figure row: the original input and each attack's reconstruction (normalized tensors)."""

    framework: str
    condition: str
    original: Tensor
    reconstructions: Mapping[str, Tensor] = field(default_factory=dict)


def _show(ax, img: Tensor, mean: Sequence[float], std: Sequence[float]) -> None:
    a = unnormalize(img, mean, std)
    if a.ndim == 3:
        a = a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0)
    ax.imshow(a, cmap="gray" if a.ndim == 2 else None, vmin=0.0, vmax=1.0, interpolation="nearest")


def save_reconstruction_grid(
    path: str | os.PathLike[str],
    rows: Sequence[GridRow],
    attack_names: Sequence[str],
    mean: Sequence[float],
    std: Sequence[float],
    cell_inches: float = 1.4,
    dpi: int = 150,
) -> Path:
    """Save the grid as PNG atomically (temp file in the target folder, then ``os.replace``).

    Uses the Agg canvas directly, so no global matplotlib backend is touched.
    A missing reconstruction leaves its cell blank with "n/a".

    Returns
    -------
    pathlib.Path
        The written file.
    """
    if not rows:
        raise ValueError("rows must contain at least one GridRow, got none")
    if not attack_names:
        raise ValueError("attack_names must name at least one attack, got none")
    out = Path(path)
    if out.suffix.lower() != ".png":
        raise ValueError(f"path must end in .png, got {str(out)!r}")
    cols = ["original", *attack_names]
    fig = Figure(figsize=(cell_inches * len(cols), cell_inches * len(rows)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(rows), len(cols), squeeze=False)
    for i, row in enumerate(rows):
        for j, col in enumerate(cols):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            img = row.original if col == "original" else row.reconstructions.get(col)
            if img is None:
                ax.text(0.5, 0.5, "n/a", ha="center", va="center", transform=ax.transAxes)
            else:
                _show(ax, img, mean, std)
            if i == 0:
                ax.set_title(col, fontsize=9)
            if j == 0:
                ax.set_ylabel(f"{row.framework}\n{row.condition}", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format="png", dpi=dpi)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return out
