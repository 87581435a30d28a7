"""k-anonymity per client with anjana, level harmonization, and pycanon-style privacy metrics.

Paper: "Privacy Preserving Machine Learning Workflow: from Anonymization to Personalized
Differential Privacy Budgets in Federated Learning", Section IV. Each client drops the
identifier, generalizes its quasi-identifiers (QIs) with anjana's k-anonymity search
(k = 5, at most 10% of records suppressed), reports its vector of hierarchy levels; the
server takes the element-wise maximum, and every client applies that vector.

Hierarchies are domain tables (one row per distinct value), as in ARX, not per-record
columns: anjana looks values up by position, so a domain table keeps its search linear
in the records. Age intervals are anchored at multiples of their width ("[20, 25)",
"[20, 30)") so that every client's labels agree and levels nest. anjana's own
``generate_intervals`` is not used: it puts a value equal to a boundary in the interval
below it (25 -> "[20, 25)").
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

IDENTIFIERS = ("Patient_ID",)
QUASI_IDENTIFIERS = ("Age", "Gender", "Year", "Cancer_Type")
SUPPRESSED = "*"
# Highest level of each QI's hierarchy: Age 0 raw / 1 five-year / 2 ten-year bins; Gender 0 raw / 1 "*";
# Year and Cancer_Type are kept unchanged (a single level 0).
HIERARCHY_DEPTH: dict[str, int] = {"Age": 2, "Gender": 1, "Year": 0, "Cancer_Type": 0}
AGE_BIN_WIDTHS = {1: 5, 2: 10}


class AnonymizationError(ValueError):
    """k-anonymity cannot be reached on a table (the message says why)."""


class HierarchyLevelError(ValueError):
    """A level vector names a level its QI's hierarchy does not have."""


@dataclass(frozen=True)
class LevelSearch:
    """Result of one client's k-anonymity search."""

    levels: tuple[int, ...]
    suppressed: int
    n_records: int


def validate_levels(levels: Sequence[int], qi: Sequence[str] = QUASI_IDENTIFIERS) -> tuple[int, ...]:
    """Check a level vector against the hierarchies; return it as a tuple of ints."""
    if len(levels) != len(qi):
        raise HierarchyLevelError(f"level vector {list(levels)} has {len(levels)} entries; expected one per "
                                  f"quasi-identifier {list(qi)}")
    out = []
    for q, lv in zip(qi, levels):
        if isinstance(lv, bool) or int(lv) != lv:
            raise HierarchyLevelError(f"level of {q} must be an integer, got {lv!r}")
        if not 0 <= int(lv) <= HIERARCHY_DEPTH[q]:
            raise HierarchyLevelError(f"level {lv} of {q} does not exist; allowed: 0..{HIERARCHY_DEPTH[q]}")
        out.append(int(lv))
    return tuple(out)


def harmonize_levels(vectors: Sequence[Sequence[int]], qi: Sequence[str] = QUASI_IDENTIFIERS) -> tuple[int, ...]:
    """Element-wise maximum of the clients' level vectors (each one validated first)."""
    if not vectors:
        raise ValueError("no level vectors to harmonize")
    checked = [validate_levels(v, qi) for v in vectors]
    return tuple(int(x) for x in np.max(np.asarray(checked), axis=0))


def _age_label(age: int, width: int) -> str:
    lo = (int(age) // width) * width
    return f"[{lo}, {lo + width})"


def build_hierarchies(df: pd.DataFrame, qi: Sequence[str] = QUASI_IDENTIFIERS) -> dict[str, dict[int, np.ndarray]]:
    """anjana hierarchies (QI -> level -> domain column) for the values present in ``df``."""
    h: dict[str, dict[int, np.ndarray]] = {}
    for q in qi:
        domain = np.array(sorted(pd.unique(df[q])), dtype=object)
        levels = {0: domain}
        if q == "Age":
            for lv, width in AGE_BIN_WIDTHS.items():
                levels[lv] = np.array([_age_label(a, width) for a in domain], dtype=object)
        elif q == "Gender":
            levels[1] = np.array([SUPPRESSED] * len(domain), dtype=object)
        h[q] = levels
    return h


def equivalence_classes(data: pd.DataFrame, quasi_ident) -> list[np.ndarray]:
    """Same output as ``pycanon.anonymity.utils.aux_anonymity.get_equiv_class`` (index labels per class,
    classes in sorted key order), from ``groupby().indices`` instead of ``groupby().groups``.

    pycanon builds one pandas Index per class; on a 5,000-record client that is ~70% of
    anjana's search time. tests/tabular_pdp checks the two agree.
    """
    qi = quasi_ident.tolist() if isinstance(quasi_ident, np.ndarray) else list(quasi_ident)
    labels = data.index.to_numpy()
    return [labels[pos] for pos in data.groupby(by=qi).indices.values()]


@contextlib.contextmanager
def fast_pycanon_classes():
    """Within the block, anjana and pycanon find equivalence classes with :func:`equivalence_classes`."""
    from pycanon.anonymity.utils import aux_anonymity

    original = aux_anonymity.get_equiv_class
    aux_anonymity.get_equiv_class = equivalence_classes
    try:
        yield
    finally:
        aux_anonymity.get_equiv_class = original


def _quiet(fn, *args):
    """Call an anjana / pycanon function without its progress prints, with the fast class finder."""
    with contextlib.redirect_stdout(io.StringIO()), fast_pycanon_classes():
        return fn(*args)


def search_levels(df: pd.DataFrame, k: int, suppression: float, qi: Sequence[str] = QUASI_IDENTIFIERS,
                  ident: Sequence[str] = IDENTIFIERS) -> LevelSearch:
    """anjana's k-anonymity search on one client's table.

    Parameters
    ----------
    k : the k of k-anonymity (>= 1).
    suppression : the largest fraction of records that may be suppressed, in [0, 1].

    Raises
    ------
    AnonymizationError when k exceeds the records or no level vector reaches k within the limit.
    """
    from anjana.anonymity import k_anonymity
    from anjana.anonymity.utils import utils as anjana_utils

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0 <= suppression <= 1:
        raise ValueError(f"suppression must be in [0, 1], got {suppression}")
    n = len(df)
    if k > n:
        raise AnonymizationError(f"k={k} exceeds the client's {n} records")
    data = df.reset_index(drop=True).copy()
    ident = [c for c in ident if c in data.columns]
    hier = build_hierarchies(data, qi)
    anon = _quiet(k_anonymity, data, list(ident), list(qi), int(k), float(suppression * 100), hier)
    if len(anon) == 0:
        raise AnonymizationError(f"k={k} is not reachable with at most {suppression:.0%} of {n} records "
                                 f"suppressed, even at the top levels {[HIERARCHY_DEPTH[q] for q in qi]}")
    levels = validate_levels(anjana_utils.get_transformation(anon, list(qi), hier), qi)
    return LevelSearch(levels, n - len(anon), n)


def apply_levels(df: pd.DataFrame, levels: Sequence[int], k: int, qi: Sequence[str] = QUASI_IDENTIFIERS,
                 ident: Sequence[str] = IDENTIFIERS) -> tuple[pd.DataFrame, int]:
    """Drop identifiers, generalize with ``levels`` (anjana) and suppress records of classes smaller than k.

    Returns the anonymized table (fresh 0..n-1 index) and the number of suppressed records.
    """
    from anjana.anonymity.utils import utils as anjana_utils

    levels = validate_levels(levels, qi)
    data = df.drop(columns=[c for c in ident if c in df.columns]).reset_index(drop=True)
    hier = build_hierarchies(data, qi)
    gen = _quiet(anjana_utils.apply_transformation, data, list(qi), hier, list(levels))
    sizes = gen.groupby(list(qi), sort=False)[list(qi)[0]].transform("size").to_numpy()
    keep = sizes >= k
    return gen.loc[keep].reset_index(drop=True), int((~keep).sum())


def equivalence_class_sizes(df: pd.DataFrame, qi: Sequence[str] = QUASI_IDENTIFIERS) -> np.ndarray:
    """Sizes of the equivalence classes (records sharing all QI values)."""
    if len(df) == 0:
        return np.zeros(0, dtype=np.int64)
    return df.groupby(list(qi), sort=False).size().to_numpy()


def arirec(sizes: Sequence[int] | np.ndarray) -> float:
    """Average re-identification risk of a client: the mean of 1/|EC| over its equivalence classes."""
    s = np.asarray(sizes, dtype=float)
    if s.size == 0:
        raise ValueError("arirec of a table without equivalence classes")
    if np.any(s < 1):
        raise ValueError(f"equivalence class sizes must be >= 1, got {s.min()}")
    return float(np.mean(1.0 / s))


def t_closeness_ordered(df: pd.DataFrame, qi: Sequence[str], sa: str) -> float:
    """t of t-closeness for a numerical attribute: max over classes of the ordered EMD.

    The definition of ``pycanon.anonymity.t_closeness`` for numeric attributes
    (EMD = sum_i |cumsum(q - p)_i| / (m - 1) over the m sorted distinct values), vectorized:
    pycanon loops over classes x values in pandas (seconds per client at 10 bins, minutes on
    raw scores). tests/tabular_pdp checks both agree.
    """
    values, codes = np.unique(df[sa].to_numpy(), return_inverse=True)
    m = len(values)
    if m < 2:
        return 0.0
    ec = df.groupby(list(qi), sort=False).ngroup().to_numpy()
    counts = np.zeros((ec.max() + 1, m))
    np.add.at(counts, (ec, codes), 1.0)
    p = counts.sum(0) / counts.sum()
    q = counts / counts.sum(1, keepdims=True)
    emd = np.abs(np.cumsum(q - p, axis=1)).sum(1) / (m - 1)
    return float(emd.max())


def discretize(y: np.ndarray, bin_width: float) -> np.ndarray:
    """Sensitive attribute for l-diversity / t-closeness: ``floor(y / w) * w`` (w = 0: unchanged)."""
    if bin_width < 0:
        raise ValueError(f"bin_width must be >= 0, got {bin_width}")
    y = np.asarray(y, dtype=float)
    return y if bin_width == 0 else np.round(np.floor(y / bin_width) * bin_width, 6)


def privacy_metrics(df: pd.DataFrame, sa: str, qi: Sequence[str] = QUASI_IDENTIFIERS) -> dict[str, float]:
    """k (pycanon), l-diversity (pycanon), t-closeness (pycanon's definition), ARIREC and #classes."""
    import pycanon.anonymity as pca

    data = df.reset_index(drop=True)  # pycanon indexes classes by position
    sizes = equivalence_class_sizes(data, qi)
    return {"k": int(_quiet(pca.k_anonymity, data, list(qi))), "l": int(_quiet(pca.l_diversity, data, list(qi), [sa])),
            "t": t_closeness_ordered(data, qi, sa), "arirec": arirec(sizes), "n_classes": int(len(sizes)),
            "n_records": int(len(data))}
