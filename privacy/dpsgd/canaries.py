"""White-box gradient canaries inside a DP-SGD optimizer: inserted into the clipped sum, observed after the noise.

The audit of DP-SGD with gradient canaries (Nasr et al., USENIX Security 2023, "Tight auditing of
differentially private machine learning", Sec. 4: Dirac canaries, all-iterates white-box threat model;
Steinke, Nasr & Jagielski, NeurIPS 2023: one run, half of the canaries never inserted). At every step
the optimizer takes, each canary j is sampled with the loader's Poisson rate q (the accountant's
subsampling); a sampled canary that the auditor inserted adds a per-example gradient of norm C along
its direction e_j (one trainable coordinate: a Dirac canary) to the *clipped* gradient sum, before the
optimizer adds its noise. The auditor then reads the privatized (noised) sum along every canary's
direction: for a held-out canary that is the noise along e_j plus the real clipped sum's coordinate.

Only the optimizer's :meth:`add_noise` is extended (:func:`with_gradient_canaries` subclasses whatever
Opacus optimizer :func:`privacy.dpsgd.engine.make_private` picked): the noise is the real optimizer's,
drawn from its own generator, so a bug in it shows in the observations; nothing in Opacus is patched,
and a run without canaries never builds this class (same optimizer, same draws, same numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

if TYPE_CHECKING:  # the mixin's methods run on an Opacus DP optimizer (its params, its add_noise)
    from opacus.optimizers import DPOptimizer as _OptimizerBase
else:
    _OptimizerBase = object


class GradientCanaries:
    """m Dirac gradient canaries of norm C for one client's DP-SGD training (one round).

    Parameters
    ----------
    included : (m,) bool
        The auditor's coin flips: only these canaries are ever inserted; the others are held out.
    clip_norm : float
        C: each inserted canary adds a per-example gradient of norm C (what clipping lets through).
    coords_rng : np.random.Generator
        Chooses the m distinct trainable coordinates (the same stream gives the same coordinates in
        every round: the scores sum over rounds).
    steps_rng : np.random.Generator
        Draws, per step, which canaries are sampled (rate q): the auditor's own randomness, never the
        optimizer's noise nor its batch sampling.
    """

    def __init__(self, included: np.ndarray, clip_norm: float, coords_rng: np.random.Generator,
                 steps_rng: np.random.Generator) -> None:
        included = np.asarray(included)
        if included.ndim != 1 or included.dtype != bool or included.size < 2:
            raise ValueError(f"included must be >= 2 booleans (the coin flips), got {included.dtype} {included.shape}")
        if not clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
        self.included = included
        self.clip_norm = float(clip_norm)
        self._coords_rng, self._steps_rng = coords_rng, steps_rng
        self.sample_rate: float | None = None
        self.dim: int | None = None
        self._param: np.ndarray | None = None  # (m,) index of the parameter holding canary j's coordinate
        self._offset: np.ndarray | None = None  # (m,) flat offset inside that parameter
        self._mask: np.ndarray | None = None
        self.projections: list[np.ndarray] = []  # one (m,) row per step: the noised sum along each canary
        self.sampled: list[np.ndarray] = []  # one (m,) bool row per step: canary sampled at that step

    @property
    def m(self) -> int:
        return int(self.included.size)

    def bind(self, params: Sequence[torch.Tensor], sample_rate: float) -> None:
        """Place the canaries on the optimizer's trainable coordinates; ``sample_rate`` is the loader's q."""
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        sizes = np.asarray([p.numel() for p in params], dtype=np.int64)
        dim = int(sizes.sum())
        if dim < self.m:
            raise ValueError(f"{self.m} distinct Dirac canaries need >= {self.m} trainable coordinates, got {dim}")
        coords = np.sort(self._coords_rng.choice(dim, size=self.m, replace=False))
        ends = np.cumsum(sizes)
        self._param = np.searchsorted(ends, coords, side="right")
        self._offset = coords - (ends - sizes)[self._param]
        self.sample_rate, self.dim = float(sample_rate), dim

    def _flat(self, t: torch.Tensor) -> torch.Tensor:
        if not t.is_contiguous():
            raise ValueError("gradient canaries need contiguous gradient tensors")
        return t.view(-1)

    def insert(self, params: Sequence[torch.Tensor]) -> None:
        """Before the noise: draw this step's sampled canaries; add C e_j to the clipped sum for the inserted ones."""
        if self._param is None:
            raise RuntimeError("GradientCanaries.bind() must run before the first step")
        self._mask = self._steps_rng.random(self.m) < cast(float, self.sample_rate)  # set by bind() with _param
        for j in np.flatnonzero(self._mask & self.included):
            with torch.no_grad():
                self._flat(params[self._param[j]].summed_grad)[int(cast(np.ndarray, self._offset)[j])] += self.clip_norm

    def observe(self, params: Sequence[torch.Tensor]) -> None:
        """After the noise: the privatized sum's coordinate along each canary (what the white-box auditor sees)."""
        if self._mask is None:
            raise RuntimeError("observe() without insert(): the optimizer skipped the canaries")
        row = np.empty(self.m)
        for i in np.unique(cast(np.ndarray, self._param)):  # insert() ran: bind() set _param and _offset
            sel = np.flatnonzero(self._param == i)
            flat = cast(torch.Tensor, params[int(i)].grad).detach().reshape(-1)  # the optimizer set p.grad
            row[sel] = flat[torch.from_numpy(cast(np.ndarray, self._offset)[sel])].double().cpu().numpy()
        self.projections.append(row)
        self.sampled.append(self._mask)
        self._mask = None

    @property
    def steps(self) -> int:
        return len(self.projections)


class _CanaryOptimizer(_OptimizerBase):
    """Mixin over an Opacus DP optimizer: canaries into the clipped sum before its noise, observed after it."""

    gradient_canaries: GradientCanaries

    def add_noise(self) -> None:
        self.gradient_canaries.insert(self.params)
        super().add_noise()  # the optimizer's own noise, std = noise_multiplier * max_grad_norm
        self.gradient_canaries.observe(self.params)


def with_gradient_canaries(optimizer_cls: type) -> type:
    """``optimizer_cls`` (an Opacus DP optimizer class) whose steps carry gradient canaries."""
    return type(f"GradientCanary{optimizer_cls.__name__}", (_CanaryOptimizer, optimizer_cls), {})
