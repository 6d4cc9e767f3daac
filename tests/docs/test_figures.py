"""The docs' benchmark figures agree with benchmarks/results/*.json (the convention is at the top of
docs/benchmarks.md and in tools/docs/figures.py): every marker names a figure that exists, every
tagged number is its figure rounded to the decimals shown, and every result file has its table."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.docs import figures, headlines  # noqa: E402

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


# The headlines (tools/docs/headlines.py): what the page shows first of a file, read from its JSON.


def _pool() -> dict:
    return json.loads((figures.RESULTS / "pool.json").read_text())


def test_every_headline_is_of_a_file_on_the_page_and_renders() -> None:
    tabled = set(figures.tabled((DOCS / "benchmarks.md").read_text()))
    for name, spec in headlines.HEADLINES.items():
        assert name in tabled, f"{name} has a headline but no bench_table on docs/benchmarks.md"
        assert figures.headline(name, figures.load(name), spec) != []


def test_the_headline_comes_first_and_the_full_table_is_folded(monkeypatch: pytest.MonkeyPatch) -> None:
    page = figures.render('{{ bench_table("pool.json") }}')
    headline, folded = page.split('??? note "All figures"\n\n')
    assert "| `placement.place_ms` |" not in headline
    assert "    | `placement.place_ms` | " in folded  # indented: inside the fold
    assert headline.index("| target | measured | limit | met |") < headline.index("Machine: cpus 2;")
    monkeypatch.delitem(headlines.HEADLINES, "crash.json")
    open_fold = figures.render('{{ bench_table("crash.json") }}')
    assert open_fold.startswith("Source: ")  # no headline: the machine, then the table shown, foldable
    assert '???+ note "All figures"' in open_fold


def test_a_headline_path_the_json_lacks_fails_naming_file_and_path(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = headlines.Headline(tables=(headlines.Table(("", "value"), (headlines.Row("x", ("http[1].nope",)),)),))
    monkeypatch.setitem(headlines.HEADLINES, "pool.json", broken)
    problems = figures.check('{{ bench_table("pool.json") }}')
    assert len(problems) == 1 and "pool.json has no 'http[1].nope'" in problems[0]
    lost = headlines.Headline(targets=(headlines.Target("t", "rounds[*].after.gone", "<", 1),))
    monkeypatch.setitem(headlines.HEADLINES, "pool.json", lost)
    assert (
        "pool.json has no 'rounds[*].after.gone' (rounds[0] has no 'after.gone')"
        in figures.check('{{ bench_table("pool.json") }}')[0]
    )


def test_a_table_with_each_has_a_row_per_item_and_names_the_item_that_lacks_a_path() -> None:
    pool = _pool()
    each = headlines.Table(
        ("", "clients", "claims/s"), (headlines.Row("#", ("clients", "claim_release_per_s")),), each="http"
    )
    rows = figures.headline("pool.json", pool, headlines.Headline(tables=(each,)))
    assert [r for r in rows if r.startswith("| # |")] == [
        f"| # | {figures.short(level['clients'])} | {figures.short(level['claim_release_per_s'])} |\n"
        for level in pool["http"]
    ]
    lacking = each._replace(rows=(headlines.Row("#", ("clients", "nope")),))
    with pytest.raises(figures.FigureError, match=r"pool.json http\[0\]: pool.json has no 'nope'"):
        figures.headline("pool.json", pool, headlines.Headline(tables=(lacking,)))


def test_star_is_the_median_over_the_rounds() -> None:
    pool = _pool()
    key = "http_16_clients_claim_release_per_s"
    after = statistics.median(r["after"][key] for r in pool["rounds"])
    assert figures.figure_at(pool, f"rounds[*].after.{key}", "pool.json") == after
    page = figures.render('{{ bench_table("pool.json") }}')
    before = statistics.median(r["before"][key] for r in pool["rounds"])
    ratio = pool["after_over_before"][key]
    assert f"| {figures.short(before)}/s | {figures.short(after)}/s | {ratio:.3f} |" in page


def test_targets_are_judged_from_the_json() -> None:
    pool = _pool()
    p99 = statistics.median(r["after"]["http_16_clients_round_trip_p99_ms"] for r in pool["rounds"])
    page = figures.render('{{ bench_table("pool.json") }}')
    row = next(line for line in page.splitlines() if line.startswith("| P1: round-trip p99"))
    assert row.endswith(f"| {figures.short(p99)} ms | < 10 ms | {'yes' if p99 < 10 else '**no**'} |")
    extender = json.loads((figures.RESULTS / "extender.json").read_text())
    limit = extender["target_p99_ms"]
    table = figures.render('{{ bench_table("extender.json") }}')
    for policy in ("fragaware", "binpack", "spread"):
        p99 = statistics.median(r["after"][f"{policy}_filter_plus_prioritize_p99_ms"] for r in extender["rounds"])
        row = next(line for line in table.splitlines() if line.startswith(f"| filter + prioritize p99, {policy}"))
        assert row.endswith(f"| {'yes' if p99 < limit else '**no**'} |")


def test_a_target_the_file_does_not_state_or_a_ratio_that_disagrees_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _pool()
    unstated = headlines.Headline(
        targets=(headlines.Target("t", "http[1].claim_release_per_s", ">=", 500, "/s", "target"),)
    )
    with pytest.raises(figures.FigureError, match="pool.json target says .*, not >= 500"):
        figures.headline("pool.json", pool, unstated)
    wrong = headlines.Compare(
        "x", "http[0].clients", "http[1].clients", "", "after_over_before.http_16_clients_round_trip_p99_ms"
    )
    with pytest.raises(figures.FigureError, match="after_over_before.http_16_clients_round_trip_p99_ms is"):
        figures.headline("pool.json", pool, headlines.Headline(comparison=headlines.Comparison("b", "a", (wrong,))))
    elsewhere = headlines.Target("t", "http[1].claim_release_per_s", ">=", 1000, "/s", where=(("machine.cpus", 64),))
    rows = figures.headline("pool.json", pool, headlines.Headline(targets=(elsewhere,)))
    assert "not measured where the target is set (machine.cpus 2)" in rows[2]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (2492.5, "2,493"),
        (31.037, "31.0"),
        (0.545, "0.545"),
        (2.375, "2.38"),
        (10000, "10,000"),
        (0.0, "0"),
        (4.6, "4.6"),
        (20.0, "20.0"),
        (3e-05, "0.00003"),
    ],
)
def test_headline_figures_show_three_significant_digits(value: float, shown: str) -> None:
    assert figures.short(value) == shown
