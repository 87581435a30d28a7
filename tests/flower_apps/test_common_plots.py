"""flower_apps.common.plots: figures without pyplot's global state, written atomically as PNG."""

from __future__ import annotations

import matplotlib

from flower_apps.common.plots import colormap, integer_ticks, save_fig, subplots


def test_figure_is_written_as_png_without_switching_the_backend_or_registering_figures(tmp_path):
    import matplotlib.pyplot as plt

    backend = matplotlib.get_backend()
    fig, axes = subplots(1, 2, figsize=(3, 2), squeeze=False)
    axes[0][0].plot([1, 2, 3], [1, 4, 9], color=colormap("tab10")(0))
    axes[0][1].xaxis.set_major_locator(integer_ticks())
    assert plt.get_fignums() == []
    save_fig(fig, tmp_path / "f.png", dpi=50)
    data = (tmp_path / "f.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.png"]
    assert matplotlib.get_backend() == backend


def test_pyplot_figures_are_closed_after_saving(tmp_path):
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(2, 2))
    save_fig(fig, tmp_path / "g.png", dpi=30)
    assert fig.number not in plt.get_fignums()
    assert (tmp_path / "g.png").stat().st_size > 0
