"""The tabular-pdp study: its name, ClientApp action and run keys (defaults = the paper's values).

Keys shared with dfl-dp keep dfl-dp's defaults (lr, local-epochs): the presets set the paper's
values. Imports nothing else of this package: config.py reads ``KEYS`` from here.
"""

from __future__ import annotations

from datasets.cancer import SOURCES
from flower_apps.config import COMMON_KEYS, SHARED_KEYS, Key, KeyTable
from privacy.anonymization import HIERARCHY_DEPTH, QUASI_IDENTIFIERS, HierarchyLevelError, validate_levels

STUDY = "tabular-pdp"
ACTION = "tabular_pdp"
SETTINGS = ("vanilla", "gdp", "pdp")
CLIP_MODES = ("estimate", "fixed")
POISONS = ("none", "shift-targets", "flip-targets", "scale-features")
# Model inputs the table offers (targets, identifiers and the client's region excluded). The paper
# speaks of 8 features without listing them; Treatment_Cost_USD and Survival_Years are outcomes,
# not risk factors, and are left out by default (Treatment_Cost_USD would make the target almost
# deterministic, see datasets.cancer). A QI generalized to a single value ("*") is dropped.
FEATURE_CHOICES = ("Age", "Gender", "Year", "Genetic_Risk", "Air_Pollution", "Alcohol_Use", "Smoking",
                   "Obesity_Level", "Cancer_Type", "Cancer_Stage", "Treatment_Cost_USD", "Survival_Years")
DEFAULT_FEATURES = FEATURE_CHOICES[:10]


def parse_levels(text: str) -> tuple[int, ...] | None:
    """``tab-levels``: '' -> None (anjana searches per client), else one checked level per quasi-identifier."""
    if not text.strip():
        return None
    allowed = ", ".join(f"{q} 0..{HIERARCHY_DEPTH[q]}" for q in QUASI_IDENTIFIERS)
    try:
        return validate_levels([int(s) for s in text.split(",") if s.strip()])
    except (ValueError, HierarchyLevelError) as exc:
        raise ValueError(f"{exc}; expected '' (search per client) or one level per "
                         f"quasi-identifier {list(QUASI_IDENTIFIERS)}: {allowed}") from None


KEYS = KeyTable(STUDY, (
    COMMON_KEYS["num-clients"].refine(ge=2),
    COMMON_KEYS["dataset"].refine(choices=SOURCES),
    # the synthetic table is generated (datasets/cancer.py); only cancer-csv reads data-dir
    COMMON_KEYS["data-dir"].refine(unused_when={"dataset": ("cancer-synthetic",)}),
    SHARED_KEYS["lr"],
    SHARED_KEYS["batch-size"],
    SHARED_KEYS["local-epochs"],
    SHARED_KEYS["test-fraction"],
    SHARED_KEYS["node-local-data"],
    SHARED_KEYS["delta-total"].refine(field="delta"),
    SHARED_KEYS["dp-fault"],
    Key("tab-k", 5, int, ge=1, field="k", doc="k of k-anonymity"),
    Key("tab-suppression", 0.1, float, ge=0, le=1, field="suppression",
        doc="largest fraction of a client's records anonymization may suppress"),
    Key("tab-levels", "", str, parse=parse_levels, field="levels",
        allowed="'' or one level per quasi-identifier (Age, Gender, Year, Cancer_Type)",
        doc="'' = anjana searches per client; '2,1,0,0' = force these generalization levels"),
    Key("tab-sa-bin-width", 0.0, float, ge=0, field="sa_bin_width",
        doc="sensitive attribute for l-diversity / t-closeness: the severity score (0 = raw) floor-binned"),
    Key("tab-features", ",".join(DEFAULT_FEATURES), str, choices=FEATURE_CHOICES, many=True, min_items=1,
        field="features", doc="model inputs (a fully suppressed quasi-identifier is dropped)"),
    Key("tab-settings", ",".join(SETTINGS), str, choices=SETTINGS, many=True, field="settings",
        doc="settings trained in one run ('' = drift detection only)"),
    Key("tab-noise-multiplier", 0.05, float, ge=0, field="noise_multiplier",
        doc="n_eps: noise multiplier of GDP and PDP"),
    Key("tab-clip-mode", "estimate", str, choices=CLIP_MODES, field="clip_mode",
        doc="clip norm C estimated as the paper does (quantile of update norms) or fixed at tab-clip-norm"),
    Key("tab-clip-norm", 8.5, float, gt=0, field="clip_norm", doc="C when tab-clip-mode is fixed"),
    Key("tab-clip-quantile", 0.9, float, gt=0, le=1, field="clip_quantile",
        doc="quantile of the update norms that estimates C"),
    Key("tab-drift-threshold", 3.5, float, gt=0, field="drift_threshold", doc="drift flagging threshold"),
    Key("tab-drift-min-ratio", 1.25, float, ge=1, field="drift_min_ratio", doc="drift flagging minimum ratio"),
    Key("tab-drift-recheck", 0, int, ge=0, field="drift_recheck", doc="re-check drift every x rounds (0 = never)"),
    Key("tab-drift-exclude", True, bool, field="drift_exclude", doc="drop the clients flagged for drift"),
    Key("tab-poison", "none", str, choices=POISONS, field="poison",
        doc="injected drift: shift-targets (y + 3 SD), flip-targets (y -> max + min - y), scale-features"),
    Key("tab-poison-client", 0, int, ge=0, field="poison_client", doc="the poisoned client (< num-clients)"),
    Key("tab-poison-scale", 3.0, float, gt=0, field="poison_scale", doc="strength of the injected drift"),
    Key("tab-audit-canaries", 0, int, ge=0, field="audit_canaries", roles=frozenset({"probe"}),
        doc="empirical privacy audit of GDP/PDP: canary clients per client (even, >= 4; half inserted), 0 = none"),
))
