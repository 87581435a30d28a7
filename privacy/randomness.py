"""Where DP noise randomness comes from: secret by default, reproducible only on request.

Threat model. DP noise protects a party's contribution from the parties that see the noised
release: the server's noise (matched perturbation, GDP, PDP) hides a client's update from the
other clients and from anyone who sees the released model; a client's DP-SGD noise hides its
examples from the server. The noise therefore must not be reproducible by those parties. The
run seed travels to every client inside the run config, so noise must never be derived from it
(an earlier version did, and any client could subtract the server's noise exactly).

Two modes:

* ``secure`` (default): every generator is seeded from 256 bits of OS entropy (``secrets``)
  drawn by the party that adds the noise, at the moment it needs them. Nothing that any
  message carries determines the noise. (Opacus' ``secure_mode`` would also need
  ``torchcsprng``, which has no build for current torch; see README, *Privacy*.)
* ``seeded`` (research opt-in): the seed is the content of a *local file* named by the
  ``noise-seed-file`` run key. Only the path travels in messages, never the content; each
  party reads its own copy (in a deployment, its own file). The same file gives the same
  noise, so a DP run can be repeated bit for bit. Anyone who can read the file can remove the
  noise: keep it private to the party whose noise it seeds.

Every other random choice of a run (partitions, initial model, client sampling) stays
derived from the run seed, as before.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NOISE_MODES = ("secure", "seeded")

# Stream labels: one per kind of noise, so two mechanisms never share a stream.
STREAM_MATCHED_PERTURBATION = 0xD9
STREAM_TABULAR_SERVER = 0x7AB
STREAM_DPSGD = 0xD95D


def _seed_from_file(path: str) -> int:
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"noise-seed-file {str(p)!r} does not exist (or is not a file)")
    data = p.read_bytes().strip()
    if not data:
        raise ValueError(f"noise-seed-file {str(p)!r} is empty; put a secret (e.g. 32 random bytes in hex) in it")
    # Hash the whole content: any length of secret, always 256 bits of seed material.
    return int.from_bytes(hashlib.sha256(data).digest(), "big")


@dataclass(frozen=True)
class NoiseSource:
    """A party's source of DP-noise randomness.

    Parameters
    ----------
    seed_file : path of a local secret file (seeded mode), or "" / None for secure mode.
    """

    seed_file: str | None = None

    @property
    def mode(self) -> str:
        """'secure' or 'seeded'."""
        return "seeded" if self.seed_file else "secure"

    def check(self) -> None:
        """Fail now (before any work) when the seed file is missing or empty."""
        if self.seed_file:
            _seed_from_file(self.seed_file)

    def seed_sequence(self, *stream: int) -> np.random.SeedSequence:
        """Fresh OS entropy (secure) or the file's secret mixed with ``stream`` (seeded)."""
        if any(int(s) < 0 for s in stream):
            raise ValueError(f"stream labels must be >= 0, got {stream}")
        if self.seed_file:
            return np.random.SeedSequence([_seed_from_file(self.seed_file), *map(int, stream)])
        return np.random.SeedSequence(secrets.randbits(256))

    def numpy_generator(self, *stream: int) -> np.random.Generator:
        """A NumPy generator for Gaussian noise."""
        return np.random.Generator(np.random.PCG64DXSM(self.seed_sequence(*stream)))

    def torch_seed(self, *stream: int) -> int:
        """A 63-bit seed for a ``torch.Generator`` (DP-SGD noise and Poisson sampling)."""
        return int(self.seed_sequence(*stream).generate_state(2, np.uint64)[0] >> np.uint64(1))

    def describe(self) -> dict:
        """What a run summary records (never the secret itself)."""
        return {"noise_mode": self.mode, "noise_seed_file": self.seed_file or None}
