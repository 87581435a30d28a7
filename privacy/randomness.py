"""Where DP noise randomness comes from: secret by default, reproducible only on request.

Threat model. DP noise protects a party's contribution from the parties that see the noised
release: the server's noise (matched perturbation, GDP, PDP) hides a client's update from the
other clients and from anyone who sees the released model; a client's DP-SGD noise hides its
examples from the server. The noise therefore must not be reproducible by those parties, and the
party that adds the noise alone holds its secret: the server for dfl-dp and tabular-pdp, each
client for ultrasound DP-SGD. The run seed travels to every client inside the run config, so
noise must never be derived from it (an earlier version did, and any client could subtract the
server's noise exactly); nor may a message name a client's seed file (an earlier version let the
coordinator's run config do so, and the coordinator replayed that client's noise).

Two modes:

* ``secure`` (default): every generator is seeded from 256 bits of OS entropy (``secrets``)
  drawn by the party that adds the noise, at the moment it needs them. Nothing that any
  message carries determines the noise. (Opacus' ``secure_mode`` would also need
  ``torchcsprng``, which has no build for current torch; see README, *Privacy*.)
* ``seeded`` (research opt-in): the seed is the content of a *local file* that the party adding
  the noise takes from its own configuration (the server: the ``noise-seed-file`` run key, which
  is the server's; a client: its SuperNode's node config or its own environment, never a
  message). The file's secret is mixed with the run's *condition* (a hash of its resolved
  config, supplied by the app) and the stream labels (mechanism, seed, client, round), so two
  runs share noise only when they are the same run: released models of two grid points (say two
  eps-cal values) cannot be combined to cancel the noise. The same file and config give the same
  noise, so a DP run can be repeated bit for bit. Anyone who can read the file can remove the
  noise: keep it private to the party whose noise it seeds.

Every other random choice of a run (partitions, initial model, each client's batch order) stays
derived from the run seed, as before; except the server's per-round cohort draw under client
sampling (privacy/sampling.py, ``STREAM_CLIENT_SAMPLING``), which amplification by sampling needs
secret from the clients: it is drawn from the server's NoiseSource like its noise.
"""

from __future__ import annotations

import hashlib
import json
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


def _condition_word(condition: str) -> int:
    """256 bits that stand for a run's condition (domain-separated from the file's hash)."""
    return int.from_bytes(hashlib.sha256(b"ppfl-noise-condition\0" + condition.encode()).digest(), "big")


@dataclass(frozen=True)
class NoiseSource:
    """A party's source of DP-noise randomness.

    Parameters
    ----------
    seed_file : path of a local secret file (seeded mode), or "" / None for secure mode. The party
        that adds the noise takes it from its own configuration, never from a message.
    condition : what the seeded stream mixes besides the secret and the stream labels: the app
        passes a hash of the run's resolved config (``flower_apps.config.noise_condition``), so
        that no two runs share noise unless they are the same run. Ignored in secure mode.
    """

    seed_file: str | None = None
    condition: str = ""

    @property
    def mode(self) -> str:
        """'secure' or 'seeded'."""
        return "seeded" if self.seed_file else "secure"

    def check(self) -> None:
        """Fail now (before any work) when the seed file is missing or empty."""
        if self.seed_file:
            _seed_from_file(self.seed_file)

    def seed_sequence(self, *stream: int) -> np.random.SeedSequence:
        """Fresh OS entropy (secure) or the file's secret mixed with the condition and ``stream`` (seeded)."""
        if any(int(s) < 0 for s in stream):
            raise ValueError(f"stream labels must be >= 0, got {stream}")
        if self.seed_file:
            return np.random.SeedSequence([_seed_from_file(self.seed_file), _condition_word(self.condition),
                                           *map(int, stream)])
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


def generator_state(rng: np.random.Generator) -> str:
    """The state of a NumPy generator as JSON text (a round checkpoint keeps it; see :func:`set_generator_state`).

    Whoever reads it can compute every draw the generator makes next: a noise generator's state is as secret
    as its seed. Only a seeded source's state is ever saved (the seed file gives it anyway); a secure
    source's never is (a resumed run draws fresh entropy)."""
    return json.dumps(rng.bit_generator.state)


def set_generator_state(rng: np.random.Generator, text: str) -> None:
    """Put :func:`generator_state`'s output back into ``rng`` (of the same bit generator), so it continues
    where the saved one stopped."""
    state = json.loads(text)
    if state.get("bit_generator") != type(rng.bit_generator).__name__:
        raise ValueError(f"a saved {state.get('bit_generator')} state cannot continue a "
                         f"{type(rng.bit_generator).__name__} generator")
    rng.bit_generator.state = state
