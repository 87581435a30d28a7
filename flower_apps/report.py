"""One page with the privacy report card of every registered study that has finished runs; and the check
that every generated number in README.md and docs/ is what the kept run folders give.

    python -m flower_apps.report [--results-dir results] [--studies dfl-dp tabular-pdp ...]
    python -m flower_apps.report --check        # exit 1 naming each generated block / value that differs
    python -m flower_apps.report --write-docs   # rewrite them from the kept data (flower_apps.common.doc_blocks)

The studies are the registered ones with a report card (``StudySpec.card``: a built-in study's
``card.py``, or ``register_study`` for any other). For each with finished runs under
``<results-dir>/<study>/runs/`` it writes the study's card (``report_card.{csv,md,png}`` in
``<results-dir>/<study>/``, :mod:`flower_apps.common.report_card`) and then
``<results-dir>/report_card.md`` with all cards, and says which studies have no results.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flower_apps.common import doc_blocks
from flower_apps.common.report_card import write_card
from flower_apps.common.results import atomic_write_text
from flower_apps.studies import STUDIES


def carded_studies() -> tuple[str, ...]:
    """Registered studies with a report card, in registration order."""
    return tuple(name for name, spec in STUDIES.items() if spec.card is not None)


def write_page(results_dir: str | Path, studies: tuple[str, ...] | None = None) -> tuple[str, list[str]]:
    """(the page's Markdown, the studies with a card); the page is written to ``report_card.md``."""
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"results directory {root} does not exist")
    studies = carded_studies() if studies is None else studies
    unknown = [s for s in studies if s not in carded_studies()]
    if unknown:
        raise ValueError(f"no report card registered for {unknown}; studies with one: {list(carded_studies())}")
    parts, done, missing = ["# Privacy report card: all studies\n"], [], []
    for study in studies:
        study_dir = root / study
        try:
            md = write_card(STUDIES[study].card, study_dir)
        except FileNotFoundError:
            missing.append(study)
            continue
        done.append(study)
        # Links relative to the page: the card's figure lives in the study folder.
        parts.append(md.replace("](report_card.png)", f"]({study}/report_card.png)"))
    if missing:
        parts.append("No finished runs (run the study's sweep first): " + ", ".join(missing) + "\n")
    page = "\n".join(parts)
    atomic_write_text(root / "report_card.md", page)
    return page, done


ROOT = Path(__file__).resolve().parents[1]


def check_docs(root: Path, *, write: bool = False) -> int:
    """``--check`` / ``--write-docs``: 0 when every generated part matches (or was rewritten), else 1."""
    problems = doc_blocks.check(root, write=write)
    for p in problems:
        print(f"docs check: {p}")
    if not problems:
        n_docs = len(doc_blocks.documents(root))
        print(f"docs check: {'rewrote' if write else 'every generated block and value matches its data in'} "
              f"{n_docs} documents ({len(doc_blocks.BLOCKS)} blocks, {len(doc_blocks.VALUES)} value namespaces)")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flower_apps.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--results-dir", default="results")
    p.add_argument("--studies", nargs="+", choices=carded_studies(), default=list(carded_studies()))
    p.add_argument("--check", action="store_true",
                   help="compare every generated block and value of README.md and docs/*.md with the kept data; "
                        "exit 1 on any difference (no training; seconds)")
    p.add_argument("--write-docs", action="store_true", help="rewrite the generated blocks and values from the kept data")
    p.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout's)")
    args = p.parse_args(argv)
    if args.check or args.write_docs:
        return check_docs(args.root, write=args.write_docs)
    try:
        page, done = write_page(args.results_dir, tuple(args.studies))
    except FileNotFoundError as exc:
        print(f"error: {exc}")
        return 2
    print(page)
    print(f"wrote {Path(args.results_dir) / 'report_card.md'} ({len(done)} of {len(args.studies)} studies)")
    return 0 if done else 1


if __name__ == "__main__":
    raise SystemExit(main())
