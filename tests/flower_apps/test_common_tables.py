"""flower_apps.common.tables: the one CSV + Markdown writer, and cells over seeds."""

from __future__ import annotations

import csv
import io
import math

import pytest
from scipy import stats

from flower_apps.common.tables import csv_text, group_by, markdown_table, seed_cell, write_table


def _old_write_table(rows: list[dict], title: str, note: str = "") -> tuple[str, str]:
    """The writer dfl-dp, tabular-pdp and unlinkable-dfl each had a copy of (no CSV escaping)."""
    cols = [c for c in rows[0] if not c.startswith("_")] if rows else []
    csv_ = ",".join(cols) + "\n" + "".join(",".join(f'"{r[c]}"' for c in cols) + "\n" for r in rows)
    md = f"### {title}\n\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    md += "".join("| " + " | ".join(str(r[c]) for c in cols) + " |\n" for r in rows)
    if note:
        md += f"\n{note}\n"
    return csv_, md


def test_hand_computed_table(tmp_path):
    rows = [{"a": 1, "b": "x", "_hidden": object()}, {"a": 2.5, "b": None}]
    md = write_table(rows, tmp_path / "t", "T", "a note")
    assert (tmp_path / "t.csv").read_text() == 'a,b\n"1","x"\n"2.5","None"\n'
    assert md == "### T\n\n| a | b |\n|---|---|\n| 1 | x |\n| 2.5 | None |\n\na note\n"
    assert (tmp_path / "t.md").read_text() == md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.md"]  # no temp files left


@pytest.mark.parametrize("note", ["", "mean +- sample SD [95% t-interval] over seeds"])
def test_same_bytes_as_the_old_writers_where_they_were_correct(tmp_path, note):
    rows = [{"framework": "FL", "condition": "C=1, eps_cal=2", "seeds": 3, "acc (%)": "91.20 +- 0.40 [90.2, 92.2]",
             "r": 0.25, "_summ": 1.0},
            {"framework": "Sequential DFL", "condition": "No-DP", "seeds": 3, "acc (%)": "Not reached (0/3)",
             "r": 1.0, "_summ": 2.0}]
    md = write_table(rows, tmp_path / "t", "Table 3", note)
    assert ((tmp_path / "t.csv").read_text(), md) == _old_write_table(rows, "Table 3", note)


def test_csv_quotes_what_the_old_writers_broke():
    cols = ["eps per client (RDP, delta)", "x"]
    text = csv_text(cols, [['say "hi"', "a,b"], ["line\nbreak", 3]])
    assert text.splitlines()[0] == '"eps per client (RDP, delta)",x'
    assert list(csv.reader(io.StringIO(text))) == [cols, ['say "hi"', "a,b"], ["line\nbreak", "3"]]


def test_csv_unquoted_values_and_markdown_float_format():
    assert csv_text(["true\\pred", "a"], [["a", 3]], quote_values=False) == "true\\pred,a\na,3\n"
    rows = [{"x": 0.123456, "y": float("nan"), "z": 7}]
    assert markdown_table(rows, "T", float_format=".4g").endswith("| 0.1235 | nan | 7 |\n")
    assert markdown_table(rows, "T").endswith("| 0.123456 | nan | 7 |\n")


def test_markdown_escapes_pipes_and_leaves_missing_cells_empty():
    md = markdown_table([{"a": "x|y", "b": 1}, {"a": "z"}], "T")
    assert md.splitlines()[-2:] == ["| x\\|y | 1 |", "| z |  |"]


def test_empty_table_is_a_title_and_a_header_less_csv(tmp_path):
    assert write_table([], tmp_path / "e", "Empty", "n") == "### Empty\n\n\nn\n"
    assert (tmp_path / "e.csv").read_text() == "\n"


def test_seed_cell_is_mean_sd_and_the_student_t_interval():
    vals = [0.91, 0.93, 0.96]
    n, mean = len(vals), sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    lo, hi = stats.t.interval(0.95, n - 1, loc=mean, scale=sd / math.sqrt(n))
    assert seed_cell(vals, 2, 100) == f"{100 * mean:.2f} +- {100 * sd:.2f} [{100 * lo:.2f}, {100 * hi:.2f}]"
    assert seed_cell([None, None, None]) == "Not reached (0/3)"
    assert seed_cell([4, None], 1) == "4.0 (reached 1/2)"  # one seed: no SD (was '4.0 +- nan')
    assert seed_cell([4, 6, None], 1) == "5.0 +- 1.4 (reached 2/3)"
    assert seed_cell([0.5], 3) == "0.500"


def test_group_by_keeps_first_seen_order():
    items = [{"k": "b", "v": 1}, {"k": "a", "v": 2}, {"k": "b", "v": 3}]
    assert {k: [i["v"] for i in g] for k, g in group_by(items, lambda i: i["k"]).items()} == {"b": [1, 3], "a": [2]}
    assert list(group_by(items, lambda i: i["k"])) == ["b", "a"]
