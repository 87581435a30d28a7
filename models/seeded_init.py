"""Seeded weight initialisation that leaves every global random generator as it was.

``torch.nn`` layers draw their initial weights from torch's global CPU generator. A builder that
called ``torch.manual_seed(seed)`` to make w(0) reproducible also reset the global CPU stream (and
every CUDA device's) for whatever ran next. :func:`seeded_init` instead forks the CPU generator,
seeds only the fork, and restores it on exit, so the weights are bit-identical to the
``torch.manual_seed`` version and the caller's random streams are untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def seeded_init(seed: int | torch.Generator) -> Iterator[None]:
    """Run the body with torch's CPU default generator seeded from ``seed``; restore it afterwards.

    Parameters
    ----------
    seed : int or torch.Generator
        An int seeds the generator as ``torch.manual_seed(seed)`` seeds the CPU (same draws).
        A CPU ``torch.Generator`` lends its state: the body draws what the generator would have
        drawn, and the generator is advanced past those draws, as if it had been used directly.

    Notes
    -----
    Only the CPU generator is forked and seeded: build modules on the CPU, then move them.
    CUDA generators are never touched (``torch.manual_seed`` would have reseeded them).
    """
    if isinstance(seed, torch.Generator):
        if seed.device.type != "cpu":
            raise ValueError(f"seed generator must be a CPU torch.Generator, got one on {seed.device}")
    elif isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or a torch.Generator, got {type(seed).__name__}")
    with torch.random.fork_rng(devices=[]):
        if isinstance(seed, torch.Generator):
            torch.random.default_generator.set_state(seed.get_state())
        else:
            torch.random.default_generator.manual_seed(seed)
        yield
        if isinstance(seed, torch.Generator):
            seed.set_state(torch.random.default_generator.get_state())
