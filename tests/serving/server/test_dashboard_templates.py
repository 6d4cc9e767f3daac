"""The dashboard's templates: every text field escaped, every template drawn, nothing escaped by hand, no silent blank."""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import re
import typing
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Set

import jinja2
import pytest

from gpupool.serving.server.dashboard import render
from gpupool.serving.server.dashboard.view import DashboardView

HOSTILE = "<script>alert(1)</script>\"'><img src=x onerror=alert(1)>&amp;"
DASHBOARD = Path(render.__file__).parent
PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
TEMPLATES = DASHBOARD / "templates"
OWN_SCRIPT = f'<script src="{render.STATIC}/dashboard.js" defer></script>'  # the page's one script, by src


def hints_of(tp: Any) -> Dict[str, Any]:
    # the workload side's modules name typing's generics for the type checker only (cheap to import)
    return typing.get_type_hints(tp, localns=vars(typing))


def hostile(tp: Any) -> Any:
    """A value of type `tp` with HOSTILE in every text field, two of each row, every optional part present.

    Dataclasses are filled past their checks (`__post_init__`): a name the pool
    would refuse must still come out escaped.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is str:
        return HOSTILE
    if tp is bool:
        return True
    if tp in (int, float):
        return tp(1)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return next(iter(tp))
    if origin is typing.Union:  # Optional[X]: X
        return hostile(next(a for a in args if a is not type(None)))
    if origin is tuple:
        return (hostile(args[0]), hostile(args[0])) if args[-1] is Ellipsis else tuple(hostile(a) for a in args)
    if origin in (dict, collections.abc.Mapping):
        return {hostile(args[0]): hostile(args[1])}
    if dataclasses.is_dataclass(tp):
        hints = hints_of(tp)
        value = object.__new__(tp)
        for f in dataclasses.fields(tp):
            object.__setattr__(value, f.name, hostile(hints[f.name]))
        return value
    if is_named_tuple(tp):  # a record such as core.model.Holder: no checks to pass
        hints = hints_of(tp)
        return tp(*(hostile(hints[name]) for name in tp._fields))
    raise AssertionError(f"no hostile value for {tp!r}: teach hostile() this type")


def text_fields(tp: Any, seen: Set[Any]) -> int:
    """How many text fields `tp` holds, through its rows and their members."""
    if tp is str:
        return 1
    if typing.get_origin(tp) in (typing.Union, tuple, dict):
        return sum(text_fields(a, seen) for a in typing.get_args(tp) if a is not Ellipsis)
    if not (dataclasses.is_dataclass(tp) or is_named_tuple(tp)) or tp in seen:
        return 0
    hints = hints_of(tp)
    names = [f.name for f in dataclasses.fields(tp)] if dataclasses.is_dataclass(tp) else tp._fields
    return sum(text_fields(hints[name], seen | {tp}) for name in names)


def is_named_tuple(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields")


@pytest.fixture(scope="module")
def drawn() -> Dict[str, str]:
    view = hostile(DashboardView)
    assert len(view.nodes) > 1 and view.teams and view.jobs and view.queue and view.actions and view.unleased
    assert view.period.by_queue and view.period.by_holder and view.period.allocated
    return {
        "page.html": render.page(view, (), auth=True),
        "live.html": render.live(view, ()),
        "login.html": render.login(HOSTILE, HOSTILE),
    }


def test_a_hostile_string_in_every_text_field_comes_out_escaped(drawn):
    assert text_fields(DashboardView, set()) >= 30  # the walk reaches the rows' members (holders, devices, jobs ...)
    for name, html in drawn.items():
        html = html.replace(OWN_SCRIPT, "", 1) if name == "page.html" else html
        lowered = html.lower()
        assert "<script" not in lowered, name
        assert "<img" not in lowered and "\"'>" not in html, name
        assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&#39;&gt;&lt;img" in html, name
        assert "&amp;amp;" in html, name  # escaped once more, never taken as already safe


def test_every_template_is_drawn(drawn):
    # each section template draws <section id="NAME">: all of them show on a page with every part present
    sections = {p.stem for p in (TEMPLATES / "sections").glob("*.html")}
    assert sections == {
        "summary",
        "charts",
        "usage",
        "nodes",
        "gpus",
        "leases",
        "teams",
        "queue",
        "jobs",
        "enforcement",
    }
    for section in sections:
        assert f'<section id="{section}"' in drawn["page.html"], section
    assert {p.name for p in TEMPLATES.glob("*.html")} == set(drawn)
    assert set(render.ENV.list_templates()) == set(drawn) | {f"sections/{s}.html" for s in sections}


def test_nothing_in_the_dashboard_is_escaped_or_trusted_by_hand():
    code = {p: p.read_text() for p in DASHBOARD.glob("*.py")}
    templates = {p: p.read_text() for p in TEMPLATES.rglob("*.html")}
    assert code and templates
    for path, text in code.items():
        for word in ("html.escape", "from html import", "escape(", "Markup", "markupsafe"):
            assert word not in text, f"{path.name} uses {word}: let the templates' autoescaping do it"
    for path, text in templates.items():
        assert not re.search(r"\|\s*safe|autoescape\s+false|Markup", text), f"{path.name} turns escaping off"
    assert render.ENV.autoescape is True
    assert render.ENV.from_string("{{ x }}").render(x="<b>") == "&lt;b&gt;"  # any template, any name


def test_a_missing_variable_fails_instead_of_drawing_a_blank():
    with pytest.raises(jinja2.UndefinedError, match="view"):
        render.ENV.get_template("live.html").render(history=())


def test_every_template_ships_in_the_wheel():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-data"][
        "gpupool.serving.server.dashboard"
    ]
    patterns = [PurePosixPath(g) for g in globs]
    for path in TEMPLATES.rglob("*.html"):
        name = PurePosixPath(path.relative_to(DASHBOARD).as_posix())
        # setuptools' globs do not cross a folder: the pattern has as many parts as the path
        assert any(name.match(str(g)) and len(g.parts) == len(name.parts) for g in patterns), (
            f"{name} is not in pyproject's package-data for gpupool.serving.server.dashboard: add its folder's glob"
        )
