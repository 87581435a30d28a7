"""Version gates for the third-party internals the adapters read (one adapter per library).

Every private access to a library lives in that library's adapter (``privacy/dpsgd/opacus_adapter.py``,
``privacy/dpsgd/timm_adapter.py``, ``strategies/flwr_adapter.py``), and each adapter declares a
:class:`VersionGate`: the versions its accesses were tested against, the same specifier as the
library's pin in pyproject.toml (tests/test_third_party_gates.py checks they agree). Before an
internal is used the gate compares the installed version:

* :meth:`VersionGate.require` -- the access matters for the numbers (noise, clipping, aggregation,
  parsing): an untested version raises :class:`UntestedVersionError`, naming the library, the tested
  version and what to do;
* :meth:`VersionGate.warn` -- the access is cosmetic (e.g. which logger prints a line): a warning.

Only release numbers are compared (``1.6.0``; a local or pre-release suffix is ignored), against
``==``, ``!=``, ``>=``, ``>``, ``<=``, ``<`` clauses joined by commas: the pins this project uses.
"""

from __future__ import annotations

import importlib.metadata
import re
import warnings
from dataclasses import dataclass
from functools import cache

_CLAUSE = re.compile(r"^(==|!=|>=|<=|>|<)\s*([0-9]+(?:\.[0-9]+)*)$")


class UntestedVersionError(RuntimeError):
    """A library's installed version is not the one an adapter's internals were tested against."""


@cache
def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (its metadata), or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"^\s*v?([0-9]+(?:\.[0-9]+)*)", version)
    if match is None:
        raise ValueError(f"not a release version: {version!r}")
    return tuple(int(p) for p in match.group(1).split("."))


def _compare(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return (a > b) - (a < b)


def satisfies(version: str, spec: str) -> bool:
    """Whether release ``version`` meets ``spec`` (e.g. ``"==1.6.0"``, ``">=1.0,<2"``)."""
    release = _release(version)
    tests = {"==": lambda c: c == 0, "!=": lambda c: c != 0, ">=": lambda c: c >= 0, "<=": lambda c: c <= 0,
             ">": lambda c: c > 0, "<": lambda c: c < 0}
    clauses = [c.strip() for c in spec.split(",") if c.strip()]
    if not clauses:
        raise ValueError(f"empty version specifier {spec!r}")
    for clause in clauses:
        match = _CLAUSE.match(clause)
        if match is None:
            raise ValueError(f"unsupported version clause {clause!r} in {spec!r}")
        if not tests[match.group(1)](_compare(release, _release(match.group(2)))):
            return False
    return True


@dataclass(frozen=True)
class VersionGate:
    """The versions of ``distribution`` that ``adapter``'s internals were tested against (``tested``).

    ``tests`` names the equivalence tests to re-run against a new version before widening ``tested``.
    """

    distribution: str
    tested: str
    adapter: str
    tests: str

    def __post_init__(self) -> None:
        satisfies("0", self.tested)  # a malformed specifier fails when the adapter is imported

    def installed(self) -> str | None:
        return installed_version(self.distribution)

    def supported(self) -> bool:
        version = self.installed()
        return version is not None and satisfies(version, self.tested)

    def _message(self, access: str) -> str:
        return (f"{access} reads internals of {self.distribution}, tested with {self.distribution}{self.tested} "
                f"(pyproject.toml pins it); installed: {self.distribution} {self.installed() or '(none)'}. "
                f"Install {self.distribution}{self.tested} (scripts/setup.sh), or run {self.tests} against the "
                f"installed version and, when they pass, widen the gate in {self.adapter} and the pin.")

    def require(self, access: str) -> None:
        """Raise :class:`UntestedVersionError` unless the installed version is a tested one."""
        if not self.supported():
            raise UntestedVersionError(self._message(access))

    def warn(self, access: str) -> bool:
        """Warn (cosmetic access) unless the installed version is a tested one; returns whether it is."""
        if self.supported():
            return True
        warnings.warn(self._message(access), RuntimeWarning, stacklevel=3)
        return False
