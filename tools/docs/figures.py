"""Benchmark figures in the docs, taken from benchmarks/results/*.json and never typed by hand.

Two ways to cite a figure (written once, at the top of docs/benchmarks.md, and checked by
tests/docs/test_figures.py):

- In a page MkDocs builds, the marker `{{ fig("pool.json", "placement.place_ms") }}` is replaced
  at build time by the value at that path of that file (tools/docs/hooks.py; a third argument
  rounds it: `{{ fig("pool.json", "placement.place_ms", 1) }}`), and
  `{{ bench_table("pool.json") }}` by the file's headline (tools/docs/headlines.py), its machine
  in a line, and folded under "All figures" the tables of the whole file (or, with more
  arguments, only of the paths named: `{{ bench_table("simulate.json", "summary") }}`).
- Anywhere else (README.md, CHANGELOG.md), or where a number must stay literal: a number tagged with
  an HTML comment right after it (a unit may stand between), `0.915 ms<!-- fig pool.json
  placement.place_ms -->`; the test fails unless the JSON's value, rounded to the decimals shown,
  is that number.

A path is the keys from the file's top down, joined by dots, with `[N]` for the Nth item of a
list: `http[2].claim_release_per_s`. A file is named relative to benchmarks/results/.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from tools.docs import headlines

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

FIG_MARKER = re.compile(r"\{\{\s*fig\(\s*\"([^\"]+)\"\s*,\s*\"([^\"]+)\"\s*(?:,\s*(\d+)\s*)?\)\s*\}\}")
TABLE_MARKER = re.compile(r"\{\{\s*bench_table\(\s*\"([^\"]+)\"((?:\s*,\s*\"[^\"]+\")*)\s*\)\s*\}\}")
# A number (1,234.5 or -0.2 or 3e-05), an optional unit, then the tag naming the figure.
TAGGED = re.compile(
    r"(?P<number>-?\d[\d,]*(?:\.\d+)?(?:[eE]-?\d+)?)\s*(?P<unit>[^\s<\d|*]{0,12})\**\s*"
    r"<!--\s*fig\s+(?P<file>\S+)\s+(?P<path>.+?)\s*-->"
)
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
MAX_LIST = 12  # scalars of a list shown in one cell; more are summarised
MACHINE_KEYS = ("gpu", "device", "driver", "gpu_memory_mib", "torch", "python", "cpus", "platform")
MACHINE_PROSE = ("note",)  # left out of the machine's line (the folded table has it)


class FigureError(ValueError):
    """A cited figure that its JSON does not have."""


def load(name: str) -> Any:
    path = RESULTS / name
    if not path.is_file():
        raise FigureError(f"no benchmark result {name}: the files are in benchmarks/results/")
    return json.loads(path.read_text())


def lookup(data: Any, path: str, name: str = "") -> Any:
    """The value at dotted `path` (with [N] for list items) of `data`."""
    value = data
    for key, index in _STEP.findall(path):
        try:
            value = value[int(index)] if index else value[key]
        except (KeyError, IndexError, TypeError):
            raise FigureError(f"{name or 'the JSON'} has no {path!r} (no {key or index!r})") from None
    return value


def fmt(value: Any) -> str:
    """A value as the docs show it: numbers as JSON writes them, lists joined."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() and abs(value) >= 10000 else repr(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    if isinstance(value, dict):  # a record inside a list (a machine's devices): its name, else its fields
        return str(value["name"]) if "name" in value else ", ".join(f"{k} {fmt(v)}" for k, v in value.items())
    if isinstance(value, list):
        shown = ", ".join(fmt(v) for v in value[:MAX_LIST])
        return f"{shown}, … ({len(value)} in all)" if len(value) > MAX_LIST else shown
    return " ".join(str(value).split())


def fig(name: str, path: str, decimals: Optional[str] = None) -> str:
    """The figure at `path` of `name`, as written there, or rounded to `decimals` places."""
    value = lookup(load(name), path, name)
    if decimals is not None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FigureError(f"{name} {path} is {value!r}, not a number to round")
        return f"{value:,.{int(decimals)}f}"
    return fmt(value)


def _cell(value: Any) -> str:
    return fmt(value).replace("|", "\\|")


def _scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list)) or (
        isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value)
    )


def _flat(data: Dict[str, Any], prefix: str = "") -> Iterator[Tuple[str, Any]]:
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            yield from _flat(value, path)
        else:
            yield path, value


def _pivot(rows: Sequence[Tuple[str, Dict[str, Any]]], first: str) -> List[str]:
    """A table with a row per item and a column per (flattened) scalar key."""
    columns: List[str] = []
    flat_rows = []
    for label, row in rows:
        flat = {k: v for k, v in _flat(row) if _scalar(v)}
        flat_rows.append((label, flat))
        columns += [k for k in flat if k not in columns]
    lines = [
        "| " + " | ".join([first, *columns]) + " |\n",
        "|" + "---|" * (len(columns) + 1) + "\n",
    ]
    for label, flat in flat_rows:
        lines.append("| " + " | ".join([label, *(_cell(flat.get(c)) if c in flat else "" for c in columns)]) + " |\n")
    return lines


def machine(data: Any) -> str:
    """Where the figures came from, as the file records it."""
    if isinstance(data, dict) and isinstance(data.get("machine"), dict):
        fields = data["machine"]
    elif isinstance(data, dict):
        fields = {k: data[k] for k in MACHINE_KEYS if k in data and _scalar(data[k])}
    else:
        fields = {}
    if not fields:
        return "not recorded in the file"
    shown = [(k, v) for k, v in _flat(fields) if k not in MACHINE_PROSE]
    if isinstance(data, dict) and "load_average_at_start" in data and _scalar(data["load_average_at_start"]):
        shown.append(("load_average_at_start", data["load_average_at_start"]))
    return "; ".join(f"{k.replace('_', ' ')} {_cell(v)}" for k, v in shown)


def _is_table_of_dicts(value: Any) -> bool:
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, dict) for v in value)
    return isinstance(value, dict) and bool(value) and all(isinstance(v, dict) for v in value.values())


def tables(name: str, only: Sequence[str] = ()) -> str:
    """The markdown of one benchmark file: its headline (tools/docs/headlines.py) if it has one, its
    machine in a line, then folded away a table of all its figures and a table per list (or
    mapping) of records in it; `only` keeps the paths named."""
    data = load(name)
    if not isinstance(data, dict):
        raise FigureError(f"{name} is not a JSON object")
    spec = headlines.HEADLINES.get(name)
    top = headline(name, data, spec) if spec else []
    top.append(f"Source: `benchmarks/results/{name}`. Machine: {machine(data)}.\n\n")
    # Folded where a headline says what matters; open (but foldable) where the file has none.
    top.append(f'???{"" if spec else "+"} note "All figures"\n\n')
    body = _all_figures(name, data, only)
    return "".join(top + [f"    {line}" if line.strip() else line for line in body])


def _all_figures(name: str, data: Dict[str, Any], only: Sequence[str]) -> List[str]:
    lines: List[str] = []
    parts = {p: lookup(data, p, name) for p in only} if only else dict(data)
    simple: List[Tuple[str, Any]] = []
    grouped: List[Tuple[str, Any]] = []

    def walk(path: str, value: Any) -> None:
        if _is_table_of_dicts(value):
            grouped.append((path, value))
        elif isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{path}.{key}", sub)
        elif _scalar(value):
            simple.append((path, value))
        else:  # a list of lists, or of mixed things: one row per item
            for i, sub in enumerate(value):
                walk(f"{path}[{i}]", sub)

    for key, value in parts.items():
        walk(key, value)
    if simple:
        lines += ["| figure | value |\n", "|---|---|\n"]
        lines += [f"| `{path}` | {_cell(value)} |\n" for path, value in simple]
        lines.append("\n")
    for path, value in grouped:
        lines.append(f"`{path}`:\n\n")
        if isinstance(value, list):
            lines += _pivot([(f"[{i}]", row) for i, row in enumerate(value)], "#")
        else:
            lines += _pivot([(str(k), row) for k, row in value.items()], "")
        lines.append("\n")
    return lines


ALL = "[*]"  # in a headline's path: the median over every item of the list before it
_CITE = re.compile(r"\{(#?)([^{}]+)\}")
_OP_SIGN = {"<": "<", "<=": "≤", ">=": "≥", ">": ">"}


def figure_at(data: Any, path: str, name: str) -> Any:
    """The value at `path` of `data`, where `[*]` takes the median over a list's items."""
    if ALL not in path:
        return lookup(data, path, name)
    head, tail = path.split(ALL, 1)
    items = lookup(data, head, name)
    if not isinstance(items, list) or not items:
        raise FigureError(f"{name} has no {path!r} ({head!r} is not a list of figures)")
    values = []
    for i, item in enumerate(items):
        try:
            values.append(figure_at(item, tail.lstrip("."), name) if tail else item)
        except FigureError:
            raise FigureError(f"{name} has no {path!r} ({head}[{i}] has no {tail.lstrip('.')!r})") from None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise FigureError(f"{name} {path!r} is {values!r}, not figures to take a median of")
    return statistics.median(values)


def short(value: Any) -> str:
    """A headline figure: three significant digits at most (whole numbers from 100 up), thousands apart."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return fmt(value)
    if isinstance(value, int):
        return f"{value:,}"
    exact = Decimal(repr(value))
    places = 0 if value == 0 or abs(value) >= 100 else 2 - math.floor(math.log10(abs(value)))
    places = min(places, max(0, -int(exact.as_tuple().exponent)))  # no digits the file did not give
    return f"{exact.quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP):,}"  # 2,492.5 is 2,493


def _with_unit(value: Any, unit: str) -> str:
    shown = short(value)
    return f"{shown}{unit}" if unit.startswith("/") else f"{shown} {unit}".rstrip()


def label(text: str, data: Any, name: str) -> str:
    """`text` with each `{path}` replaced by that figure and each `{#path}` by that list's length."""

    def cite(m: re.Match[str]) -> str:
        found = lookup(data, m.group(2), name)
        return str(len(found)) if m.group(1) else short(found)

    return _CITE.sub(cite, text).replace("|", "\\|")


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |\n"


def _rule(n: int) -> str:
    return "|---" + "|--:" * (n - 1) + "|\n"


def _ratio(name: str, data: Any, row: headlines.Compare, before: float, after: float) -> float:
    if row.ratio is None:
        return after / before
    stated = lookup(data, row.ratio, name)
    if abs(stated - after / before) > 0.0005 + 1e-9:  # the file rounds it to 3 decimals
        raise FigureError(f"{name} {row.ratio} is {stated!r}, but {row.after} ÷ {row.before} is {after / before:.3f}")
    return float(stated)


def _target(name: str, data: Any, target: headlines.Target) -> List[str]:
    if target.op not in headlines.OPS:
        raise FigureError(f"{name}: target {target.label!r} has op {target.op!r}; use one of {headlines.OPS}")
    measured = figure_at(data, target.path, name)
    limit: Union[float, int] = figure_at(data, target.limit, name) if isinstance(target.limit, str) else target.limit
    if target.stated_in is not None:
        text = str(lookup(data, target.stated_in, name))
        if f"{target.op} {limit:g}" not in text:
            raise FigureError(
                f"{name} {target.stated_in} says {text!r}, not {target.op} {limit:g}: "
                "make tools/docs/headlines.py agree with the file"
            )
    elsewhere = [(path, lookup(data, path, name)) for path, want in target.where if lookup(data, path, name) != want]
    met = {"<": measured < limit, "<=": measured <= limit, ">=": measured >= limit, ">": measured > limit}[target.op]
    if elsewhere:
        verdict = "not measured where the target is set (" + ", ".join(f"{p} {fmt(v)}" for p, v in elsewhere) + ")"
    else:
        verdict = "yes" if met else "**no**"
    sign = _OP_SIGN[target.op]
    return [
        _row(
            [
                label(target.label, data, name),
                _with_unit(measured, target.unit),
                f"{sign} {_with_unit(limit, target.unit)}",
                verdict,
            ]
        )
    ]


def _table_rows(name: str, data: Any, row: headlines.Row, each: Optional[str]) -> List[str]:
    """`row` of `data`, or with `each` the row for every item of that list (paths within an item)."""
    if each is None:
        items: List[Tuple[str, Any]] = [("", data)]
    else:
        found = lookup(data, each, name)
        if not isinstance(found, list):
            raise FigureError(f"{name} has no list {each!r} to show a row per item of")
        items = [(f"{each}[{i}].", item) for i, item in enumerate(found)]
    lines = []
    for at, item in items:
        try:
            cells = [_with_unit(figure_at(item, path, name), row.unit) for path in row.paths]
            lines.append(_row([label(row.label, item, name), *cells]))
        except FigureError as err:
            if not at:
                raise
            raise FigureError(f"{name} {at.rstrip('.')}: {err}") from None
    return lines


def headline(name: str, data: Any, spec: headlines.Headline) -> List[str]:
    """The markdown of a file's headline: its tables, before and after, its targets."""
    lines: List[str] = []
    for table in spec.tables:
        if table.caption:
            lines.append(label(table.caption, data, name) + "\n\n")
        lines += [_row([label(c, data, name) for c in table.columns]), _rule(len(table.columns))]
        for row in table.rows:
            if len(row.paths) != len(table.columns) - 1:
                raise FigureError(
                    f"{name}: headline row {row.label!r} has {len(row.paths)} paths for {len(table.columns) - 1} columns"
                )
            lines += _table_rows(name, data, row, table.each)
        lines.append("\n")
    if spec.comparison is not None:
        ab = spec.comparison
        if ab.note:  # above the table: it says what the columns are
            lines.append(label(ab.note, data, name) + "\n\n")
        lines += [_row(["", label(ab.before, data, name), label(ab.after, data, name), "after ÷ before"]), _rule(4)]
        for pair in ab.rows:
            before, after = figure_at(data, pair.before, name), figure_at(data, pair.after, name)
            ratio = _ratio(name, data, pair, before, after)
            lines.append(
                _row(
                    [
                        label(pair.label, data, name),
                        _with_unit(before, pair.unit),
                        _with_unit(after, pair.unit),
                        f"{ratio:.3f}",
                    ]
                )
            )
        lines.append("\n")
    if spec.targets:
        lines += [_row(["target", "measured", "limit", "met"]), _rule(4)]
        for target in spec.targets:
            lines += _target(name, data, target)
        lines.append("\n")
    return lines


COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


def render(markdown: str) -> str:
    """`markdown` with its fig and bench_table markers replaced (a bad one raises FigureError);
    inside an HTML comment (the convention's own examples) they stay as written."""
    parts = []
    at = 0
    for m in COMMENT.finditer(markdown):
        parts += [_render(markdown[at : m.start()]), m.group(0)]
        at = m.end()
    return "".join([*parts, _render(markdown[at:])])


def _render(markdown: str) -> str:
    markdown = TABLE_MARKER.sub(
        lambda m: tables(m.group(1), re.findall(r"\"([^\"]+)\"", m.group(2) or "")).rstrip("\n"), markdown
    )
    return FIG_MARKER.sub(lambda m: fig(m.group(1), m.group(2), m.group(3)), markdown)


def tagged(text: str) -> Iterator[Tuple[str, str, str, str]]:
    """(number as written, unit, file, path) of each tagged number in `text`."""
    for m in TAGGED.finditer(text):
        yield m.group("number"), m.group("unit"), m.group("file"), m.group("path")


def agrees(written: str, value: Any) -> bool:
    """Whether the number `written` is `value` rounded to the decimals written (1.5 for 1.49)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    shown = written.replace(",", "")
    if "e" in shown.lower():
        return float(shown) == float(value)
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(round(float(value), decimals) - float(shown)) < 10 ** (-decimals) / 2 + 1e-12


def check(text: str) -> List[str]:
    """What is wrong with the figures `text` cites: markers that do not resolve, tagged numbers
    that disagree with their JSON. [] when all agree."""
    problems: List[str] = []
    for m in FIG_MARKER.finditer(text):
        try:
            fig(m.group(1), m.group(2), m.group(3))
        except FigureError as err:
            problems.append(f"{m.group(0)}: {err}")
    for m in TABLE_MARKER.finditer(text):
        try:
            tables(m.group(1), re.findall(r"\"([^\"]+)\"", m.group(2) or ""))
        except FigureError as err:
            problems.append(f"{m.group(0)}: {err}")
    for number, _unit, name, path in tagged(text):
        try:
            value = lookup(load(name), path, name)
        except FigureError as err:
            problems.append(f"{number} tagged {name} {path}: {err}")
            continue
        if not agrees(number, value):
            problems.append(f"{number} tagged {name} {path}: the JSON says {value!r}")
    return problems


def result_files() -> List[str]:
    """Every benchmark result file, relative to benchmarks/results/."""
    return sorted(str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*.json"))


def tabled(markdown: str) -> List[str]:
    """The files `markdown` has a bench_table of."""
    return [m.group(1) for m in TABLE_MARKER.finditer(markdown)]
