"""Name -> object registries that refuse duplicates (models, aggregators, topologies, partitioners, attacks).

One small class instead of a hand-written dict and ``register_*`` function per family (STYLE.md:
"Registries map names to classes and refuse duplicates"). A ``Registry`` is a read-mostly ``dict``:
lookups, ``in``, iteration and ``sorted(...)`` work as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(dict[str, T], Generic[T]):
    """A registry of ``kind`` objects; :meth:`register` refuses a name that is taken."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, name: str, obj: T) -> T:
        """Add ``obj`` under ``name``; returns it (so it also works as a decorator body)."""
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self[name] = obj
        return obj

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@REG.decorator("name")`` registers the decorated function or class."""
        return lambda obj: self.register(name, obj)
