"""One page with the privacy report card of every registered study that has finished runs.

    python -m flower_apps.report [--results-dir results] [--studies dfl-dp tabular-pdp ...]

The studies are the registered ones with a report card (``StudySpec.card``: a built-in study's
``card.py``, or ``register_study`` for any other). For each with finished runs under
``<results-dir>/<study>/runs/`` it writes the study's card (``report_card.{csv,md,png}`` in
``<results-dir>/<study>/``, :mod:`flower_apps.common.report_card`) and then
``<results-dir>/report_card.md`` with all cards, and says which studies have no results.
"""

from __future__ import annotations

import argparse
from pathlib import Path

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flower_apps.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--results-dir", default="results")
    p.add_argument("--studies", nargs="+", choices=carded_studies(), default=list(carded_studies()))
    args = p.parse_args(argv)
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
