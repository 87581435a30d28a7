"""Result tables: one CSV + Markdown writer for every study, and the cells they hold over seeds.

A table is a list of row dicts; its columns are the first row's keys, except keys starting with
``_`` (values kept beside a row for figures, e.g. a :class:`SeedSummary`). Cells over seeds
read ``mean +- sample SD [95% t-interval]``, or ``Not reached (k/n)`` (:class:`SeedSummary`).
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from flower_apps.common.results import atomic_write_text
from flower_apps.common.stats import summarize

_T = TypeVar("_T")


def columns(rows: Sequence[dict]) -> list[str]:
    """The table's columns: the first row's keys, without the hidden ``_`` ones."""
    return [c for c in rows[0] if not c.startswith("_")] if rows else []


def csv_text(cols: Sequence[str], rows: Iterable[Sequence[Any]], quote_values: bool = True) -> str:
    """CSV (RFC 4180 quoting by the csv module, ``\\n`` line ends) of a header and value rows.

    The header is quoted only where needed; values are all quoted when ``quote_values`` (the
    studies' tables), else only where needed. Values are written as ``str(v)`` (None as ``None``).
    """
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cols)
    values = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_ALL if quote_values else csv.QUOTE_MINIMAL)
    values.writerows([str(v) for v in row] for row in rows)
    return buf.getvalue()


def markdown_table(rows: Sequence[dict], title: str, note: str = "", float_format: str | None = None) -> str:
    """``### title``, the pipe table of :func:`columns` (missing cells empty) and an optional note."""
    cols = columns(rows)
    cell = (lambda v: format(v, float_format) if isinstance(v, float) else str(v)) if float_format else str
    md = f"### {title}\n\n"
    if cols:
        md += "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
        md += "".join("| " + " | ".join(cell(r.get(c, "")).replace("|", "\\|") for c in cols) + " |\n"
                      for r in rows)
    if note:
        md += f"\n{note}\n"
    return md


def write_table(rows: Sequence[dict], stem: str | Path, title: str, note: str = "",
                float_format: str | None = None) -> str:
    """Write ``stem.csv`` and ``stem.md`` atomically; return the Markdown.

    ``float_format`` (e.g. ``".4g"``) formats float cells of the Markdown only; the CSV keeps
    ``str(v)``, the full value.
    """
    stem = Path(stem)
    cols = columns(rows)
    atomic_write_text(stem.with_suffix(".csv"), csv_text(cols, ([r.get(c, "") for c in cols] for r in rows)))
    md = markdown_table(rows, title, note, float_format)
    atomic_write_text(stem.with_suffix(".md"), md)
    return md


def seed_cell(values: Iterable[float | None], digits: int = 2, scale: float = 1.0) -> str:
    """One cell over seeds: ``mean +- SD [95% t-interval]`` of ``value * scale`` (None = not reached)."""
    return summarize([None if v is None else float(v) * scale for v in values]).fmt(digits)


def group_by(items: Iterable[_T], key: Callable[[_T], Hashable]) -> dict[Any, list[_T]]:
    """Items by ``key(item)``, groups and their members in first-seen order."""
    groups: dict[Any, list[_T]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return dict(groups)
