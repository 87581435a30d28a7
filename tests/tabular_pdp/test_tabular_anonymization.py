"""Anonymization: levels, harmonization (also through Flower messages), ARIREC, t-closeness, errors."""

import numpy as np
import pandas as pd
import pytest

from datasets.cancer import TARGET, generate_cancer_table
from flower_apps.config import ConfigError
from privacy.anonymization import (
    QUASI_IDENTIFIERS,
    AnonymizationError,
    HierarchyLevelError,
    apply_levels,
    arirec,
    build_hierarchies,
    equivalence_class_sizes,
    equivalence_classes,
    harmonize_levels,
    privacy_metrics,
    search_levels,
    t_closeness_ordered,
    validate_levels,
)


def make_cfg(**over):
    from flower_apps.tabular_pdp.config import config_for

    return config_for("smoke", **over)


def crafted_table(seed: int = 0) -> pd.DataFrame:
    """Regions needing different levels: A none, B Age 5-year bins, C Age 10-year + Gender; D has 3 rows."""
    df = generate_cancer_table(seed=seed, country_counts={"A": 300, "B": 400, "C": 200, "D": 3})
    rng = np.random.default_rng(seed)
    a, b, c = (df.Country_Region == r for r in "ABC")
    df.loc[a, "Age"] = rng.choice([40, 50], a.sum())
    df.loc[a | b, ["Year", "Gender", "Cancer_Type"]] = [2020, "Male", "Lung"]
    df.loc[c, "Year"] = 2020
    df.loc[c, "Cancer_Type"] = rng.choice(["Lung", "Skin"], c.sum())
    return df


@pytest.fixture(scope="module")
def crafted_csv(tmp_path_factory):
    p = tmp_path_factory.mktemp("cancer") / "crafted.csv"
    crafted_table().to_csv(p, index=False)
    return p


def test_level_vectors_are_checked_against_the_hierarchies():
    assert validate_levels([2, 1, 0, 0]) == (2, 1, 0, 0)
    with pytest.raises(HierarchyLevelError, match="level 3 of Age does not exist; allowed: 0..2"):
        validate_levels([3, 0, 0, 0])
    with pytest.raises(HierarchyLevelError, match="level 1 of Year does not exist; allowed: 0..0"):
        validate_levels([0, 0, 1, 0])
    with pytest.raises(HierarchyLevelError, match="level -1 of Gender"):
        validate_levels([0, -1, 0, 0])
    with pytest.raises(HierarchyLevelError, match="expected one per quasi-identifier"):
        validate_levels([1, 1])


def test_harmonization_is_the_elementwise_maximum():
    assert harmonize_levels([[0, 0, 0, 0], [1, 0, 0, 0], [2, 1, 0, 0]]) == (2, 1, 0, 0)
    assert harmonize_levels([[2, 0, 0, 0], [0, 1, 0, 0]]) == (2, 1, 0, 0)
    assert harmonize_levels([[1, 0, 0, 0]]) == (1, 0, 0, 0)
    with pytest.raises(HierarchyLevelError):
        harmonize_levels([[2, 0, 0, 0], [0, 2, 0, 0]])
    with pytest.raises(ValueError, match="no level vectors"):
        harmonize_levels([])


def test_age_intervals_nest_and_put_boundaries_in_the_upper_bin():
    df = pd.DataFrame({"Age": [20, 24, 25, 29, 30, 89], "Gender": ["Male"] * 6, "Year": [2020] * 6,
                       "Cancer_Type": ["Lung"] * 6})
    h = build_hierarchies(df)["Age"]
    got = dict(zip(h[0], zip(h[1], h[2])))
    assert got[25] == ("[25, 30)", "[20, 30)")
    assert got[24] == ("[20, 25)", "[20, 30)")
    assert got[30] == ("[30, 35)", "[30, 40)")
    assert got[89] == ("[85, 90)", "[80, 90)")


def test_arirec_on_hand_made_equivalence_classes():
    # classes of sizes 2, 3 and 5 -> (1/2 + 1/3 + 1/5) / 3
    df = pd.DataFrame({"Age": ["[20, 30)"] * 2 + ["[30, 40)"] * 3 + ["[20, 30)"] * 5,
                       "Gender": ["*"] * 10, "Year": [2020] * 5 + [2021] * 5, "Cancer_Type": ["Lung"] * 10})
    assert sorted(equivalence_class_sizes(df)) == [2, 3, 5]
    assert arirec(equivalence_class_sizes(df)) == pytest.approx((1 / 2 + 1 / 3 + 1 / 5) / 3)
    assert arirec([5, 5, 5, 5]) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        arirec([])


def test_equivalence_classes_equal_pycanons(rng):
    from pycanon.anonymity.utils.aux_anonymity import get_equiv_class

    df = pd.DataFrame({"a": rng.integers(0, 4, 60), "b": rng.choice(["x", "y"], 60), "c": rng.integers(0, 3, 60)})
    for qi in (["a"], ["a", "b"], ["a", "b", "c"]):
        ours, theirs = equivalence_classes(df, qi), get_equiv_class(df, qi)
        assert [sorted(x) for x in ours] == [sorted(x) for x in theirs]


@pytest.mark.parametrize("decimals", [0, 1])
def test_t_closeness_equals_pycanon_and_a_hand_case(rng, decimals):
    import pycanon.anonymity as pca

    df = pd.DataFrame({"q": rng.integers(0, 5, 80), "r": rng.choice(["m", "f"], 80),
                       "s": np.round(rng.uniform(0, 3, 80), decimals)})
    assert t_closeness_ordered(df, ["q", "r"], "s") == pytest.approx(pca.t_closeness(df, ["q", "r"], ["s"]), abs=1e-12)
    # hand case: values 1, 2, 3 overall p = (1/2, 1/4, 1/4); class {1, 1} has q = (1, 0, 0):
    # cumsum(q - p) = (1/2, 1/4, 0) -> EMD = (1/2 + 1/4) / (3 - 1) = 3/8; class {2, 3} gives 1/4
    hand = pd.DataFrame({"q": [0, 0, 1, 1], "s": [1, 1, 2, 3]})
    assert t_closeness_ordered(hand, ["q"], "s") == pytest.approx(3 / 8)


def test_search_then_apply_reaches_k_and_counts_suppression(crafted_csv):
    df = pd.read_csv(crafted_csv)
    c = df[df.Country_Region == "C"]
    res = search_levels(c, k=5, suppression=0.1)
    assert res.levels == (2, 1, 0, 0) and res.n_records == 200
    anon, suppressed = apply_levels(c, res.levels, k=5)
    assert "Patient_ID" not in anon.columns
    assert equivalence_class_sizes(anon).min() >= 5
    assert suppressed == res.suppressed == 200 - len(anon)
    assert set(anon["Gender"]) == {"*"} and all(str(a).startswith("[") for a in anon["Age"])
    # coarser levels never suppress more (what makes the harmonized maximum safe)
    raw, supp_raw = apply_levels(c, (0, 0, 0, 0), k=5)
    assert supp_raw > suppressed and supp_raw == 200 - len(raw)
    m = privacy_metrics(anon.assign(sa=anon[TARGET]), "sa")
    assert m["k"] >= 5 and m["l"] >= 1 and 0 <= m["t"] <= 1
    assert m["arirec"] == pytest.approx(np.mean(1 / equivalence_class_sizes(anon)))


def test_k_larger_than_the_records_or_unreachable_is_an_error(crafted_csv):
    df = pd.read_csv(crafted_csv)
    with pytest.raises(AnonymizationError, match="k=5 exceeds the client's 3 records"):
        search_levels(df[df.Country_Region == "D"], k=5, suppression=0.1)
    with pytest.raises(AnonymizationError, match="k=150 is not reachable"):
        search_levels(df[df.Country_Region == "C"], k=150, suppression=0.0)


def test_harmonization_runs_through_flower_messages(crafted_csv, fake_grid_cls):
    from flower_apps.router import client_app
    from flower_apps.tabular_pdp.phases import anonymize_and_harmonize

    cfg = make_cfg(**{"dataset": "cancer-csv", "data-dir": str(crafted_csv), "num-clients": 4})
    grid = fake_grid_cls([11, 12, 13, 14], lambda node, msg: client_app(msg, None))
    out = anonymize_and_harmonize(grid, cfg, [0, 1, 2, 3])
    assert {c: v["levels"] for c, v in out.own.items()} == {0: [0, 0, 0, 0], 1: [1, 0, 0, 0], 2: [2, 1, 0, 0]}
    assert out.levels == (2, 1, 0, 0) and out.levels_source.startswith("element-wise maximum")
    assert "k=5 exceeds the client's 3 records" in out.skipped[3] and out.regions[3] == "D"
    assert out.active == [0, 1, 2]
    queries = [(m.metadata.message_type, m.content["config"]["query"], list(m.content["config"].get("levels", [])))
               for _, m in grid.log]
    assert queries[:4] == [("query.tabular_pdp", "anonymize", [])] * 4
    assert queries[4:] == [("query.tabular_pdp", "harmonize", [2, 1, 0, 0])] * 3  # none for the skipped client
    for _cid, h in out.harmonized.items():
        assert h["k"] >= 5 and h["suppressed"] >= 0 and h["n_records"] + h["suppressed"] == h["n_original"]
        assert 0 < h["arirec"] <= 0.2
    # region A needed no suppression on its own but shares the maximum: Age in 10-year bins, Gender suppressed
    assert out.harmonized[0]["n_classes"] == 2


def test_every_client_failing_stops_the_run_with_the_reasons(crafted_csv, fake_grid_cls):
    from flower_apps.router import client_app
    from flower_apps.tabular_pdp.phases import anonymize_and_harmonize

    cfg = make_cfg(**{"dataset": "cancer-csv", "data-dir": str(crafted_csv), "num-clients": 4, "tab-k": 500})
    grid = fake_grid_cls([1], lambda node, msg: client_app(msg, None))
    with pytest.raises(RuntimeError, match="failed on every client: client 0: k=500 exceeds the client's 300"):
        anonymize_and_harmonize(grid, cfg, [0, 1, 2, 3])


def test_fixed_levels_that_suppress_too_much_skip_the_client_with_a_reason(crafted_csv, fake_grid_cls):
    from flower_apps.router import client_app
    from flower_apps.tabular_pdp.phases import anonymize_and_harmonize

    cfg = make_cfg(**{"dataset": "cancer-csv", "data-dir": str(crafted_csv), "num-clients": 3,
                      "tab-levels": "0,0,0,0"})
    grid = fake_grid_cls([1, 2], lambda node, msg: client_app(msg, None))
    out = anonymize_and_harmonize(grid, cfg, [0, 1, 2])
    assert out.levels_source == "fixed by tab-levels" and not out.own
    assert out.active == [0] and "more than tab-suppression=0.1" in out.skipped[2]


def test_nonexistent_levels_fail_in_config_and_in_a_client():
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

    from flower_apps.tabular_pdp.client_app import query

    with pytest.raises(ConfigError, match="tab-levels: level 3 of Age does not exist"):
        make_cfg(**{"tab-levels": "3,0,0,0"})
    with pytest.raises(ConfigError, match="tab-levels"):
        make_cfg(**{"tab-levels": "2,1,x,0"})
    cfg = make_cfg()
    msg = Message(RecordDict({"arrays": ArrayRecord(), "config": ConfigRecord(
        {"run-config": cfg.to_json(), "query": "harmonize", "levels": [2, 2, 0, 0], "client-ids": [0]})}),
        message_type="query.tabular_pdp", dst_node_id=1)
    with pytest.raises(HierarchyLevelError, match="level 2 of Gender does not exist"):
        query(msg, None)
    assert QUASI_IDENTIFIERS == ("Age", "Gender", "Year", "Cancer_Type")
