"""Reconstruction quality: the only place where ground truth meets a reconstruction.

Per-gradient scores (:func:`score_reconstruction`) and their aggregation into
table rows (:func:`aggregate_over_seeds`).

Both images are un-normalized with the caller's ``mean`` / ``std``
(``x * std + mean`` per channel) and clipped to ``[0, 1]`` before comparison, so
MSE, PSNR and SSIM are on the pixel scale with ``data_range = 1``. Clipping
matters only for unconstrained attacks (DLG, iDLG), whose iterates may leave the
valid range.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
from skimage.metrics import structural_similarity
from torch import Tensor

from attacks.inversion.registry import InversionResult
from attacks.stats import summarize_over_seeds

#: PSNR is capped here (reached at MSE <= 1e-10, e.g. identical images) so that
#: means over seeds stay finite.
PSNR_CAP_DB = 100.0


def unnormalize(x: Tensor | np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """``x * std + mean`` per channel (dim 0 of ``(C, H, W)``), clipped to ``[0, 1]``, float64."""
    a = x.detach().cpu().double().numpy() if isinstance(x, Tensor) else np.asarray(x, dtype=np.float64)
    if a.ndim < 2:
        raise ValueError(f"x must be an image of shape (C, H, W) or (H, W), got {a.shape}")
    if len(mean) != len(std) or len(mean) not in (1, a.shape[0] if a.ndim == 3 else 1):
        raise ValueError(f"mean and std must have 1 or C entries each, got {len(mean)} and {len(std)} for shape {a.shape}")
    if any(not s > 0 for s in std):
        raise ValueError(f"std must be > 0, got {tuple(std)}")
    shape = (len(mean),) + (1,) * (a.ndim - 1) if a.ndim == 3 else (1,) * a.ndim
    m = np.asarray(mean, dtype=np.float64).reshape(shape)
    s = np.asarray(std, dtype=np.float64).reshape(shape)
    return np.clip(a * s + m, 0.0, 1.0)


def _pair(reconstruction: np.ndarray, original: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r, o = np.asarray(reconstruction, np.float64), np.asarray(original, np.float64)
    if r.shape != o.shape:
        raise ValueError(f"reconstruction and original must have equal shapes, got {r.shape} and {o.shape}")
    return r, o


def mse(reconstruction: np.ndarray, original: np.ndarray) -> float:
    """Mean squared error on the ``[0, 1]`` pixel scale."""
    r, o = _pair(reconstruction, original)
    return float(np.mean((r - o) ** 2))


def psnr(reconstruction: np.ndarray, original: np.ndarray, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio ``10 log10(data_range^2 / MSE)`` in dB, capped at :data:`PSNR_CAP_DB`."""
    if not data_range > 0:
        raise ValueError(f"data_range must be > 0, got {data_range}")
    err = mse(reconstruction, original)
    if err == 0.0:
        return PSNR_CAP_DB
    return min(PSNR_CAP_DB, 10.0 * math.log10(data_range**2 / err))


def ssim(reconstruction: np.ndarray, original: np.ndarray, data_range: float = 1.0) -> float:
    """SSIM (``skimage.metrics.structural_similarity``) with an explicit ``data_range``.

    ``(C, H, W)`` images use ``channel_axis=0``; the Gaussian-free 7x7 window
    shrinks to the largest odd size that fits images smaller than 7 pixels.
    """
    r, o = _pair(reconstruction, original)
    if r.ndim == 3 and r.shape[0] == 1:
        r, o = r[0], o[0]
    if r.ndim not in (2, 3):
        raise ValueError(f"images must have shape (H, W) or (C, H, W), got {r.shape}")
    side = min(r.shape[-2:])
    if side < 3:
        raise ValueError(f"images must be at least 3x3 for SSIM, got {r.shape}")
    win = min(7, side if side % 2 else side - 1)
    kw = {"channel_axis": 0} if r.ndim == 3 else {}
    return float(structural_similarity(o, r, data_range=data_range, win_size=win, **kw))


def score_reconstruction(
    reconstruction: InversionResult | Tensor,
    original: Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    true_label: int | None = None,
) -> dict[str, float]:
    """MSE, PSNR and SSIM of a reconstruction against the true (normalized) input.

    Parameters
    ----------
    reconstruction : InversionResult or Tensor
        An attack result or a normalized image of shape ``input_shape``.
    original : Tensor
        The true normalized input, shape ``input_shape`` (a leading batch dim of 1 is dropped).
    mean, std : sequence of float
        Per-channel normalization of the data.
    true_label : int, optional
        If given (with an ``InversionResult``), adds ``label_correct`` (1.0 or 0.0).
    """
    rec = reconstruction.reconstruction if isinstance(reconstruction, InversionResult) else reconstruction
    orig = original[0] if original.ndim == rec.ndim + 1 and original.shape[0] == 1 else original
    if tuple(rec.shape) != tuple(orig.shape):
        raise ValueError(f"original must have shape {tuple(rec.shape)}, got {tuple(original.shape)}")
    r, o = unnormalize(rec, mean, std), unnormalize(orig, mean, std)
    out = {"mse": mse(r, o), "psnr": psnr(r, o), "ssim": ssim(r, o)}
    if true_label is not None:
        if not isinstance(reconstruction, InversionResult):
            raise ValueError("true_label needs an InversionResult (a bare tensor has no inferred label)")
        out["label_correct"] = float(reconstruction.label == int(true_label))
    return out


def random_image_mse(original: Tensor, mean: Sequence[float], std: Sequence[float], generator: torch.Generator) -> float:
    """MSE of a uniform random ``[0, 1]`` image against ``original``: the chance level of MSE."""
    o = unnormalize(original, mean, std)
    noise = torch.rand(o.shape, generator=generator, dtype=torch.float64).numpy()
    return mse(noise, o)


DEFAULT_METRICS: tuple[str, ...] = ("mse", "psnr", "ssim", "label_correct")


def aggregate_over_seeds(
    rows: Iterable[Mapping[str, object]],
    group_keys: Sequence[str] = ("framework", "condition", "attack"),
    metrics: Sequence[str] = DEFAULT_METRICS,
    seed_key: str = "seed",
) -> list[dict[str, object]]:
    """Average the gradients within each seed, then summarize over seeds.

    Parameters
    ----------
    rows : iterable of mapping
        One row per attacked gradient, with ``group_keys``, ``seed_key`` and
        the ``metrics`` present (metrics missing from every row are skipped).
    group_keys : sequence of str
        Keys defining one table row, e.g. framework, condition and attack.
    metrics : sequence of str
        Metric names to summarize.
    seed_key : str
        Key of the seed.

    Returns
    -------
    list of dict
        Per group: the group keys, ``n_seeds``, ``n_gradients`` (total), and for
        each metric ``<m>_mean``, ``<m>_sd``, ``<m>_ci95_low``, ``<m>_ci95_high``
        (:func:`attacks.stats.summarize_over_seeds`), in first-seen group order.
    """
    per_seed: dict[tuple, dict[object, list[Mapping[str, object]]]] = defaultdict(lambda: defaultdict(list))
    for i, row in enumerate(rows):
        missing = [k for k in (*group_keys, seed_key) if k not in row]
        if missing:
            raise ValueError(f"rows[{i}] lacks keys {missing}")
        per_seed[tuple(row[k] for k in group_keys)][row[seed_key]].append(row)
    out: list[dict[str, object]] = []
    for group, seeds in per_seed.items():
        summary: dict[str, object] = dict(zip(group_keys, group))
        summary["n_seeds"] = len(seeds)
        summary["n_gradients"] = sum(len(r) for r in seeds.values())
        for m in metrics:
            if not any(m in r for rs in seeds.values() for r in rs):
                continue
            seed_means = []
            for seed, rs in seeds.items():
                vals = [float(r[m]) for r in rs if m in r]  # type: ignore[arg-type]
                if len(vals) != len(rs):
                    raise ValueError(f"metric {m!r} is missing in some rows of group {group}, seed {seed}")
                seed_means.append(float(np.mean(vals)))
            summary.update(summarize_over_seeds(seed_means).as_dict(prefix=f"{m}_"))
            summary.pop(f"{m}_n")
        out.append(summary)
    return out
