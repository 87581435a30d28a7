"""The benchmark table's cells, shared by ``python -m benchmarks`` (README's block) and the documents'
blocks that show a subset of the kept rows (``results_bench/benchmarks.json``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

KEPT_ROWS = "results_bench/benchmarks.json"


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}" if abs(v) < 0.1 else f"{v:.2f}"


def target_text(r: dict) -> str:
    return "-" if r.get("target") is None else f"{r.get('target_on', 'ratio')} {r.get('op', '<=')} {fmt(r['target'])}"


def met_text(r: dict, markdown: bool) -> str:
    if r.get("met") is None:
        return "-"
    return "yes" if r["met"] else ("**no**" if markdown else "NO")


def table_lines(rows: list[dict], markdown: bool) -> list[str]:
    head = ["benchmark", "metric", "value", "reference", "ratio", "target", "met"]
    cells = [[r.get("benchmark", ""), r["metric"], fmt(r["value"]), fmt(r["reference"]), fmt(r["ratio"]),
              target_text(r), met_text(r, markdown)] for r in rows]
    if markdown:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(c) + " |" for c in cells]
    widths = [max(len(x) for x in col) for col in zip(head, *cells)]
    line = lambda c: "  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip()
    return [line(head), line(["-" * w for w in widths])] + [line(c) for c in cells]


def kept_rows_block(benchmarks: tuple[str, ...]) -> Callable[[Path], str]:
    """A document block: the kept rows of ``benchmarks`` (names as in ``python -m benchmarks --list``) with
    the machine and date they were measured on."""

    def render(root: Path) -> str:
        path = root / KEPT_ROWS
        if not path.is_file():
            raise FileNotFoundError(f"kept file {KEPT_ROWS} is missing")
        data = json.loads(path.read_text())
        rows = [r for r in data["rows"] if r.get("benchmark") in benchmarks]
        missing = sorted(set(benchmarks) - {r["benchmark"] for r in rows})
        if missing:
            raise ValueError(f"{KEPT_ROWS} has no rows of {missing}")
        m = data["machine"]
        return "\n".join([*table_lines(rows, markdown=True), "",
                          f"From `{KEPT_ROWS}` (`{data['command']}`, {m['date']}, {m['cpu']}, {m['cores']} cores, "
                          f"load average {m['load']} at the start)."])

    render.__doc__ = f"the kept benchmark rows of {', '.join(benchmarks)}"
    return render
