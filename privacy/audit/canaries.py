"""Canary clients of a client-level audit: random isotropic updates at the clip norm, half of them inserted.

Andrew et al. (ICLR 2024), Sec. 3: a canary client's update is a random direction scaled to the
clip norm C (so clipping leaves it as it is); each canary is inserted into the run with
probability 1/2 (here: exactly half, at random), and the held-out half gives the null
distribution of the test statistic.

Who generates them. The auditor, from its own randomness: fresh OS entropy by default, or a local
seed file for a repeatable audit (``privacy.randomness.NoiseSource`` with the stream label
:data:`STREAM_AUDIT_CANARIES`, which no noise stream uses). Canaries are never derived from the DP
noise generator nor from the run seed: an audit whose canaries correlated with the noise would
measure nothing.

Cross-talk. With K canaries in one model, canary j's component along canary k adds variance to k's
statistic: relative to a canary's own signal its variance is about K_in / d. When d < 20 K the
directions are made exactly orthonormal (QR of a Gaussian matrix with the sign fix: each column is
still uniform on the sphere), which removes it; above that (e.g. 200 canaries in a 200k-parameter
CNN, 400 in the 17k-parameter tabular MLP) cross-talk is below 2.5% of the signal and the QR
(O(d K^2)) is skipped. Those large sets are float32 (like the models they enter), scaled to
C (1 - 1e-5) so that rounding never puts a canary above the clip norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from privacy.randomness import NoiseSource

STREAM_AUDIT_CANARIES = 0xA0D17  # distinct from every noise stream in privacy.randomness


@dataclass(frozen=True)
class CanarySet:
    """The auditor's canaries: ``vectors`` (K, d) at norm ``clip_norm``; ``inserted`` (K,) bool mask.

    ``groups`` (K,) int: which population each canary stands for (tabular PDP: the client whose
    weight and privacy risk it takes; -1 = one population).
    """

    vectors: np.ndarray
    inserted: np.ndarray
    clip_norm: float
    groups: np.ndarray
    #: canary norms as multiples of C: (1, 1) = at C (clipping leaves them unchanged); (2, 10) = above C, so
    #: that they test the clipping code they must pass through like any client (issue 37)
    norm_range: tuple[float, float] = (1.0, 1.0)

    def __post_init__(self) -> None:
        v, ins, g = self.vectors, self.inserted, self.groups
        if v.ndim != 2:
            raise ValueError(f"canary vectors must be (K, d), got shape {v.shape}")
        if ins.shape != (v.shape[0],) or ins.dtype != bool:
            raise ValueError(f"inserted must be a bool mask of shape ({v.shape[0]},), got {ins.dtype} {ins.shape}")
        if g.shape != (v.shape[0],):
            raise ValueError(f"groups must have shape ({v.shape[0]},), got {g.shape}")
        lo, hi = self.norm_range
        if not 0 < lo <= hi:
            raise ValueError(f"norm_range must be 0 < lo <= hi (multiples of C), got {self.norm_range}")
        norms = self.norms
        if np.any(norms > hi * self.clip_norm * (1 + 1e-9)):
            raise ValueError(f"a canary's norm {norms.max():g} exceeds the clip norm {self.clip_norm:g} x {hi:g}")

    @cached_property
    def norms(self) -> np.ndarray:
        """Each canary's L2 norm, accumulated in float64."""
        return row_norms(self.vectors)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def inserted_indices(self) -> np.ndarray:
        return np.flatnonzero(self.inserted)

    def inserted_in_group(self, group: int) -> np.ndarray:
        return np.flatnonzero(self.inserted & (self.groups == group))

    def describe(self) -> dict:
        """What a result file records (never the vectors)."""
        return {"num_canaries": int(self.vectors.shape[0]), "num_inserted": int(self.inserted.sum()),
                "dim": self.dim, "clip_norm": self.clip_norm, "norm_range_over_c": list(self.norm_range),
                "groups": sorted({int(x) for x in self.groups})}


def make_canaries(num: int, dim: int, clip_norm: float, rng: np.random.Generator,
                  groups: np.ndarray | None = None, orthogonal: bool | None = None,
                  norm_range: tuple[float, float] = (1.0, 1.0)) -> CanarySet:
    """``num`` random isotropic canaries of norm ``clip_norm`` in R^dim; half of each group inserted.

    ``orthogonal`` (default: when num <= dim < 20 num) makes the directions orthonormal (see module doc).
    ``norm_range`` = (lo, hi): each canary's norm is C times a uniform draw from [lo, hi] (default: C);
    canaries above C test the clipping they pass through (a skipped clip lets them in at full norm).
    """
    if num < 2 or num % 2:
        raise ValueError(f"num canaries must be an even number >= 2 (half inserted, half held out), got {num}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    groups = np.full(num, -1, dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    if groups.shape != (num,):
        raise ValueError(f"groups must have shape ({num},), got {groups.shape}")
    orthogonal = num <= dim < 20 * num if orthogonal is None else orthogonal
    if orthogonal and num > dim:
        raise ValueError(f"cannot make {num} orthogonal canaries in dimension {dim}")
    if orthogonal:
        q, r = np.linalg.qr(rng.standard_normal((dim, num)))
        dirs = np.ascontiguousarray((q * np.sign(np.where(np.diag(r) == 0, 1.0, np.diag(r)))).T)
        dirs *= clip_norm
    else:  # row-major float32 from the start: K x d can be hundreds of MB (no transposed copy)
        dirs = rng.standard_normal((num, dim), dtype=np.float32)
        dirs *= (clip_norm * (1 - 1e-5) / row_norms(dirs))[:, None].astype(np.float32)
    lo, hi = norm_range
    if not 0 < lo <= hi:
        raise ValueError(f"norm_range must be 0 < lo <= hi (multiples of C), got {norm_range}")
    if (lo, hi) != (1.0, 1.0):  # norms drawn in [lo C, hi C]; the direction stays uniform on the sphere
        dirs *= rng.uniform(lo, hi, num).astype(dirs.dtype)[:, None]
    inserted = np.zeros(num, dtype=bool)
    for grp in np.unique(groups):
        idx = np.flatnonzero(groups == grp)
        if idx.size < 2:
            raise ValueError(f"group {grp} has {idx.size} canary; each group needs >= 2 (inserted and held out)")
        inserted[rng.permutation(idx)[: idx.size // 2]] = True
    return CanarySet(dirs, inserted, float(clip_norm), groups, (float(lo), float(hi)))


def row_norms(v: np.ndarray) -> np.ndarray:
    """L2 norm of each row, accumulated in float64, a block of rows at a time (no copy of the whole array)."""
    step = max(1, 4_000_000 // max(v.shape[1], 1))
    return np.concatenate([np.sqrt(np.square(v[i:i + step], dtype=np.float64).sum(axis=1))
                           for i in range(0, v.shape[0], step)]) if v.shape[0] else np.zeros(0)


def auditor_generator(seed_file: str | None = None, *stream: int, condition: str = "") -> np.random.Generator:
    """The auditor's generator: OS entropy, or a local seed file mixed with the run's ``condition``
    (``NoiseSource``; never the DP noise stream)."""
    return NoiseSource(seed_file or None, condition).numpy_generator(STREAM_AUDIT_CANARIES, *stream)
