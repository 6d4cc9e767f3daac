"""The docs' benchmark figures agree with benchmarks/results/*.json (the convention is at the top of
docs/benchmarks.md and in tools/docs/figures.py): every marker names a figure that exists, every
tagged number is its figure rounded to the decimals shown, and every result file has its table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.docs import figures  # noqa: E402

DOCS = ROOT / "docs"
# Every page of the site, and the files beside it that quote figures.
PAGES = sorted(DOCS.rglob("*.md")) + [p for p in (ROOT / "README.md", ROOT / "CHANGELOG.md") if p.exists()]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_figure_agrees_with_its_json(page: Path) -> None:
    assert figures.check(page.read_text()) == []


def test_every_result_file_has_its_table() -> None:
    tabled = set(figures.tabled((DOCS / "benchmarks.md").read_text()))
    missing = [name for name in figures.result_files() if name not in tabled]
    assert missing == [], f"add {{{{ bench_table(...) }}}} for these to docs/benchmarks.md: {missing}"


def test_the_rendered_tables_show_each_figure_of_their_json() -> None:
    page = figures.render((DOCS / "benchmarks.md").read_text())
    assert "bench_table(" not in page.split("-->", 1)[1]  # all replaced, but in the convention's comment
    assert 'bench_table("pool.json")' in page.split("-->", 1)[0]
    pool = json.loads((figures.RESULTS / "pool.json").read_text())
    row = f"| `placement.place_ms` | {figures.fmt(pool['placement']['place_ms'])} |"
    assert row in page
    for record in pool["http"]:
        assert f"| {record['claim_release_per_s']} |" in page


def test_a_tagged_number_that_drifted_is_reported() -> None:
    value = json.loads((figures.RESULTS / "pool.json").read_text())["placement"]["place_ms"]
    assert figures.check(f"placement takes {value} ms<!-- fig pool.json placement.place_ms -->") == []
    assert figures.check(f"placement takes **{round(value, 1)} ms**<!-- fig pool.json placement.place_ms -->") == []
    problems = figures.check("placement takes 1.5 ms<!-- fig pool.json placement.place_ms -->")
    assert len(problems) == 1 and "1.5" in problems[0] and repr(value) in problems[0]


def test_a_marker_naming_no_figure_is_reported() -> None:
    assert figures.check('{{ fig("pool.json", "placement.nope") }}')[0].endswith("(no 'nope')")
    assert "no benchmark result" in figures.check('{{ fig("gone.json", "x") }}')[0]
    assert "no benchmark result" in figures.check('{{ bench_table("gone.json") }}')[0]
    assert figures.check('{{ fig("pool.json", "http[7].clients") }}') != []


def test_markers_are_replaced_by_their_values() -> None:
    pool = json.loads((figures.RESULTS / "pool.json").read_text())
    text = figures.render('{{ fig("pool.json", "http[1].claim_release_per_s") }} claims/s')
    assert text == f"{pool['http'][1]['claim_release_per_s']} claims/s"
    rounded = figures.render('{{ fig("pool.json", "http[1].claim_release_per_s", 0) }}')
    assert rounded == f"{pool['http'][1]['claim_release_per_s']:,.0f}"
    assert "not a number" in figures.check('{{ fig("pool.json", "target", 1) }}')[0]


@pytest.mark.parametrize(
    ("written", "value", "agrees"),
    [
        ("1.5", 1.49, True),
        ("1.5", 1.44, False),
        ("4,128", 4128.4, True),
        ("0.915", 0.915, True),
        ("3", 2.918, True),
        ("8.1", 2.918, False),
        ("1", True, False),
    ],
)
def test_rounding_of_a_tagged_number(written: str, value: object, agrees: bool) -> None:
    assert figures.agrees(written, value) is agrees
