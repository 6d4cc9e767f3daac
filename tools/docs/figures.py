"""Benchmark figures in the docs, taken from benchmarks/results/*.json and never typed by hand.

Two ways to cite a figure (written once, at the top of docs/benchmarks.md, and checked by
tests/docs/test_figures.py):

- In a page MkDocs builds, the marker `{{ fig("pool.json", "placement.place_ms") }}` is replaced
  at build time by the value at that path of that file (tools/docs/hooks.py; a third argument
  rounds it: `{{ fig("pool.json", "placement.place_ms", 1) }}`), and
  `{{ bench_table("pool.json") }}` by the tables of the whole file (or, with more arguments,
  only of the paths named: `{{ bench_table("simulate.json", "summary") }}`).
- Anywhere else (README.md, CHANGELOG.md), or where a number must stay literal: a number tagged with
  an HTML comment right after it (a unit may stand between), `0.915 ms<!-- fig pool.json
  placement.place_ms -->`; the test fails unless the JSON's value, rounded to the decimals shown,
  is that number.

A path is the keys from the file's top down, joined by dots, with `[N]` for the Nth item of a
list: `http[2].claim_release_per_s`. A file is named relative to benchmarks/results/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

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
    return "; ".join(f"{k} {_cell(v)}" for k, v in _flat(fields))


def _is_table_of_dicts(value: Any) -> bool:
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, dict) for v in value)
    return isinstance(value, dict) and bool(value) and all(isinstance(v, dict) for v in value.values())


def tables(name: str, only: Sequence[str] = ()) -> str:
    """The markdown of one benchmark file: its machine, a table of its figures, and a table per
    list (or mapping) of records in it; `only` keeps the paths named."""
    data = load(name)
    lines = [f"Source: `benchmarks/results/{name}`. Machine: {machine(data)}.\n\n"]
    if not isinstance(data, dict):
        raise FigureError(f"{name} is not a JSON object")
    parts = {p: lookup(data, p, name) for p in only} if only else {k: v for k, v in data.items() if k != "machine"}
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
    return "".join(lines)


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
