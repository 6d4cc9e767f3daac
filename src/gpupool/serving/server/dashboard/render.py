"""The dashboard's HTML, from the Jinja2 templates in `templates/`: the page, its live part, the sign-in page.

Autoescaping is on for every template, so each value from the pool is
escaped where it is written, with no call to forget; a missing variable
raises (StrictUndefined) instead of drawing an empty cell. The page carries
no inline script, so the routes' Content-Security-Policy can forbid it.
"""

from __future__ import annotations

from typing import Sequence

from jinja2 import Environment, PackageLoader, StrictUndefined

from . import shapes
from .history import Point
from .period import RANGE_NAMES
from .units import clock, duration, gib, mib, percent
from .view import DashboardView

STATIC = "/ui/static"
REFRESH_MS = 2000


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader(__package__, "templates"),
        autoescape=True,  # every template is HTML: no file name can turn it off
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,  # the templates are package data: read once
    )
    env.filters.update(mib=mib, gib=gib, duration=duration, percent=percent, clock=clock, num=format)
    env.globals.update(STATIC=STATIC, REFRESH_MS=REFRESH_MS, BAR_W=shapes.BAR_W, bar=shapes.bar)
    env.globals.update(CHART_W=shapes.CHART_W, CHART_H=shapes.CHART_H, charts=shapes.charts)
    env.globals.update(RANGE_NAMES=RANGE_NAMES)
    return env


ENV = _environment()


def page(view: DashboardView, history: Sequence[Point], auth: bool) -> str:
    """The whole dashboard document."""
    return ENV.get_template("page.html").render(view=view, history=history, auth=auth)


def live(view: DashboardView, history: Sequence[Point]) -> str:
    """The refreshed part of the page: summary, charts, usage, nodes, GPUs, leases, queue, enforcement."""
    return ENV.get_template("live.html").render(view=view, history=history)


def login(error: str = "", auth_hint: str = "") -> str:
    """The sign-in page: one token field; the token becomes an HttpOnly cookie."""
    return ENV.get_template("login.html").render(error=error, auth_hint=auth_hint)
