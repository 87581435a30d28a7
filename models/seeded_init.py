"""Seeded regions that leave every global random generator as it was.

``torch.nn`` layers draw their initial weights, and dropout its masks, from torch's global
generators. A builder that called ``torch.manual_seed(seed)`` to make w(0) reproducible also reset
the global CPU stream (and every CUDA device's) for whatever ran next. :func:`seeded_init` instead
forks the generators the region draws from, seeds only the forks, and restores them on exit, so the
draws are bit-identical to the ``torch.manual_seed`` version and the caller's random streams are
untouched. Built-in uses: initial weights (every model builder) and a client's local training,
whose dropout masks draw from the global generator during the forward passes (dfl-dp). The seeds
themselves come from :mod:`registry.streams`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def seeded_init(seed: int | torch.Generator, device: torch.device | str | None = None) -> Iterator[None]:
    """Run the body with torch's CPU default generator seeded from ``seed``; restore it afterwards.

    Parameters
    ----------
    seed : int or torch.Generator
        An int seeds the generator as ``torch.manual_seed(seed)`` seeds the CPU (same draws).
        A CPU ``torch.Generator`` lends its state: the body draws what the generator would have
        drawn, and the generator is advanced past those draws, as if it had been used directly.
    device : torch.device, str or None
        A CUDA device the body draws on (dropout masks of a model trained there): its generator is
        forked too and seeded with the int ``seed``, as ``torch.manual_seed`` seeded it, and restored
        on exit. None or a CPU device: only the CPU generator.

    Notes
    -----
    Only the CPU generator (and ``device``'s) is forked and seeded: build modules on the CPU, then
    move them. Other CUDA generators are never touched (``torch.manual_seed`` would have reseeded them).
    """
    if isinstance(seed, torch.Generator):
        if seed.device.type != "cpu":
            raise ValueError(f"seed generator must be a CPU torch.Generator, got one on {seed.device}")
    elif isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or a torch.Generator, got {type(seed).__name__}")
    cuda = torch.device(device) if device is not None else None
    if cuda is not None and cuda.type != "cuda":
        cuda = None
    if cuda is not None and isinstance(seed, torch.Generator):
        raise ValueError("a CUDA device's generator is seeded from an int seed, not a CPU generator")
    index = (cuda.index if cuda.index is not None else torch.cuda.current_device()) if cuda is not None else None
    with torch.random.fork_rng(devices=[] if index is None else [index]):
        if isinstance(seed, torch.Generator):
            torch.random.default_generator.set_state(seed.get_state())
        else:
            torch.random.default_generator.manual_seed(seed)
            if index is not None:
                with torch.cuda.device(index):
                    torch.cuda.manual_seed(seed)
        yield
        if isinstance(seed, torch.Generator):
            seed.set_state(torch.random.default_generator.get_state())
