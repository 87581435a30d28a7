"""Generated parts of README.md and docs/*.md, rebuilt from kept run folders and checked in CI.

    python -m flower_apps.report --check        # exit 1, naming each block / value that differs
    python -m flower_apps.report --write-docs   # rewrite them in place (atomically)

Two kinds of generated text, both invisible in rendered Markdown:

* a **block** (a table, a list) between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``, rendered by
  the function registered under ``NAME`` in :data:`BLOCKS`;
* an inline **value** in prose, ``<!--v:NS.KEY-->76.51<!--/v-->``, looked up as ``KEY`` in the dict that
  the function registered under ``NS`` in :data:`VALUES` returns.

Each function reads only files kept in the repository (``results_*/``: configs, summaries, rounds,
attack and audit JSON) and is pure, so the check needs no training and takes seconds. A marker whose
name is not registered, a registered block that no document uses, a value key the function does not
give, or any difference between the document and its data fails the check: a number edited by hand in
a generated span cannot pass.

Where they are registered: a study's ``flower_apps/<pkg>/docs.py`` (``BLOCKS`` / ``VALUES`` dicts,
picked up by :func:`flower_apps.studies.load_study`), and for platform-wide tables (benchmarks, the audit's
detection rates) :func:`include_block`: the block is a kept Markdown file written next to its data by
the command that measured it (a test checks that file against its data); docs/audit.md's measured tables and
values, which span three studies' kept audit runs, are :mod:`flower_apps.common.audit_docs`'s (registered at the end).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from flower_apps.common.bench_table import kept_rows_block
from flower_apps.common.results import atomic_write_text
from registry import Registry

#: block name -> render(repository root) -> the block's Markdown
BLOCKS: Registry[Callable[[Path], str]] = Registry("doc block")
#: value namespace -> values(repository root) -> {key: the text shown in the document}
VALUES: Registry[Callable[[Path], Mapping[str, str]]] = Registry("doc value namespace")

#: The documents that may hold generated parts (relative to the repository root).
DOCUMENTS = ("README.md", "docs/*.md")

_BLOCK = re.compile(r"<!-- ([a-z0-9][a-z0-9._-]*):start -->\n(.*?)\n<!-- \1:end -->", re.S)
_VALUE = re.compile(r"<!--v:([a-z0-9_-]+)\.([A-Za-z0-9_.-]+)-->(.*?)<!--/v-->", re.S)
_ANY_START = re.compile(r"<!-- ([a-z0-9][a-z0-9._-]*):start -->")


@dataclass(frozen=True)
class Difference:
    """One generated part of a document that differs from (or cannot be rebuilt from) its data."""

    document: str
    name: str
    problem: str

    def __str__(self) -> str:
        return f"{self.document}: {self.name}: {self.problem}"


def include_block(path: str) -> Callable[[Path], str]:
    """A block that is the kept file ``path`` (relative to the root), e.g. a table a benchmark wrote."""

    def render(root: Path) -> str:
        file = root / path
        if not file.is_file():
            raise FileNotFoundError(f"kept file {path} is missing")
        return file.read_text().strip()

    render.__doc__ = f"the kept file {path}"
    return render


def documents(root: Path) -> list[Path]:
    """README.md and docs/*.md under ``root``, sorted."""
    out: list[Path] = []
    for pattern in DOCUMENTS:
        out += sorted(root.glob(pattern))
    return out


def _rendered(fn: Callable[[Path], str], root: Path) -> str:
    return fn(root).strip()


def rebuild(text: str, root: Path, document: str, cache: dict[str, Mapping[str, str]]) -> tuple[str, list[Difference]]:
    """``text`` with every generated part rebuilt from the kept data, and what could not be rebuilt."""
    problems: list[Difference] = []
    starts = {m.group(1) for m in _ANY_START.finditer(text)}
    closed = {m.group(1) for m in _BLOCK.finditer(text)}
    problems += [Difference(document, name, "start marker without its end marker") for name in sorted(starts - closed)]

    def block(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in BLOCKS:
            problems.append(Difference(document, name, f"no block of that name is registered ({sorted(BLOCKS)})"))
            return m.group(0)
        try:
            body = _rendered(BLOCKS[name], root)
        except (OSError, ValueError, KeyError) as exc:
            problems.append(Difference(document, name, f"cannot be rebuilt: {type(exc).__name__}: {exc}"))
            return m.group(0)
        return f"<!-- {name}:start -->\n{body}\n<!-- {name}:end -->"

    def value(m: re.Match[str]) -> str:
        ns, key = m.group(1), m.group(2)
        if ns not in VALUES:
            problems.append(Difference(document, f"{ns}.{key}", f"no value namespace {ns!r} is registered"))
            return m.group(0)
        if ns not in cache:
            try:
                cache[ns] = VALUES[ns](root)
            except (OSError, ValueError, KeyError) as exc:
                problems.append(Difference(document, f"{ns}.{key}", f"cannot be rebuilt: {type(exc).__name__}: {exc}"))
                return m.group(0)
        if key not in cache[ns]:
            problems.append(Difference(document, f"{ns}.{key}", f"namespace {ns!r} gives no value {key!r}"))
            return m.group(0)
        return f"<!--v:{ns}.{key}-->{cache[ns][key]}<!--/v-->"

    return _VALUE.sub(value, _BLOCK.sub(block, text)), problems


def used_names(texts: Iterable[str]) -> tuple[set[str], set[str]]:
    """(block names, value namespaces) that ``texts`` use."""
    blocks: set[str] = set()
    spaces: set[str] = set()
    for text in texts:
        blocks |= {m.group(1) for m in _BLOCK.finditer(text)}
        spaces |= {m.group(1) for m in _VALUE.finditer(text)}
    return blocks, spaces


def check(root: Path, *, write: bool = False) -> list[Difference]:
    """Every generated part of every document against its data; with ``write``, rewrite what differs.

    Returns the differences (empty: every document is what its data gives). With ``write`` only the
    parts that cannot be rebuilt are returned; the others are rewritten.
    """
    root = Path(root)
    cache: dict[str, Mapping[str, str]] = {}
    problems: list[Difference] = []
    texts = []
    for path in documents(root):
        rel = str(path.relative_to(root))
        text = path.read_text()
        texts.append(text)
        new, unbuilt = rebuild(text, root, rel, cache)
        problems += unbuilt
        if new == text:
            continue
        if write:
            atomic_write_text(path, new)
            continue
        old_parts = {m.group(0) for m in (*_BLOCK.finditer(text), *_VALUE.finditer(text))}
        for m in (*_BLOCK.finditer(new), *_VALUE.finditer(new)):
            if m.group(0) not in old_parts:
                name = m.group(1) if m.re is _BLOCK else f"{m.group(1)}.{m.group(2)}"
                problems.append(Difference(rel, name, "differs from its data (regenerate: "
                                                      "python -m flower_apps.report --write-docs)"))
    blocks, spaces = used_names(texts)
    problems += [Difference("(registry)", name, "registered block that no document uses")
                 for name in sorted(set(BLOCKS) - blocks)]
    problems += [Difference("(registry)", ns, "registered value namespace that no document uses")
                 for ns in sorted(set(VALUES) - spaces)]
    return problems


# Platform-wide tables: kept beside the data that the command which measured them wrote.
BLOCKS.register("audit-detection", include_block("results_audit/detection.md"))  # benchmarks/audit_detection.py
BLOCKS.register("benchmarks", include_block("results_bench/benchmarks.md"))  # python -m benchmarks --write-readme
# docs/mixnet.md: the kept Sphinx / mixnet-round rows, and one simulated round's output as it printed
BLOCKS.register("mixnet-bench", kept_rows_block(("sphinx", "mixnet-round")))
BLOCKS.register("mixnet-simulation-speed", include_block("results_bench/mixnet_simulation_speed.md"))  # --keep
# The audit's measured tables and numbers in docs/audit.md, rebuilt from the kept audited runs of three studies
# (results_audit/, results_bench/): one module for all of them, not one study's docs.py.
from flower_apps.common import audit_docs  # noqa: E402  (it imports nothing of this module)

for _name, _render in audit_docs.BLOCKS.items():
    BLOCKS.register(_name, _render)
for _ns, _values in audit_docs.VALUES.items():
    VALUES.register(_ns, _values)
# docs/deployment.md's measured deployment tables (results_deploy/: benchmarks/deploy_vs_simulation.py and
# scripts/docker_federation.sh write the records).
from flower_apps.common import deploy_docs  # noqa: E402

for _name, _render in deploy_docs.BLOCKS.items():
    BLOCKS.register(_name, _render)
