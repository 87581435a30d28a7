"""Generated blocks in Markdown documents: the text between a start and an end marker, replaced atomically."""

from __future__ import annotations

import os
from pathlib import Path


def replace_block(text: str, block: str, start: str, end: str, what: str = "the document") -> str:
    """``text`` with what lies between ``start`` and ``end`` replaced by ``block``."""
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"{what} must contain {start} ... {end} exactly once, in that order")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{block.strip()}\n{end}{tail}"


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
