"""The dashboard as HTML with inline SVG, drawn on the server: no script library, no CDN, no template engine.

`page()` is the whole document, `live()` the part the page's script fetches
again every few seconds (`/ui/live`) and swaps in. Every value from the pool
passes through `_e` (HTML escaping); the page carries no inline script, so
the Content-Security-Policy of the routes can forbid it.
"""

from __future__ import annotations

import time
from html import escape
from typing import List, Optional, Sequence, Tuple

from ...core.quantity import format_mib
from .history import Point
from .view import DashboardView, GpuRow, JobRow, LeaseRow, QueueRow

STATIC = "/ui/static"
REFRESH_MS = 2000
COLORS = 8  # lease colours l0..l7 / u0..u7 in dashboard.css
BAR_W = 1000.0  # the bars' viewBox width; CSS stretches it to the cell

Series = Tuple[str, str, List[Tuple[float, float]]]  # name, CSS class, (time, value) points


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def mib(value: Optional[int]) -> str:
    """MiB in a human unit; '–' when unknown."""
    return "–" if value is None else format_mib(int(value))


def duration(seconds: float) -> str:
    """A short human duration: 42s, 3m 05s, 2h 07m, 3d 4h."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole else "–"


def _color(lease_id: str) -> int:
    return sum(lease_id.encode()) % COLORS


def page(view: DashboardView, history: Sequence[Point], auth: bool) -> str:
    """The whole dashboard document."""
    logout = (
        '<form method="post" action="/logout" class="logout"><button type="submit">Sign out</button></form>'
        if auth
        else ""
    )
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>gpupool · {_e(view.node)}</title>"
        '<link rel="icon" href="data:,">'
        f'<link rel="stylesheet" href="{STATIC}/dashboard.css">'
        f'<script src="{STATIC}/dashboard.js" defer></script>'
        "</head><body>"
        '<header><h1>gpupool</h1><span class="node">' + _e(view.node) + "</span>"
        '<form method="get" action="/" class="filter" id="filter">'
        f'<input type="search" name="q" value="{_e(view.query)}" placeholder="filter leases: holder, namespace, id"'
        ' aria-label="filter leases"></form>'
        '<span id="state" class="state" role="status"></span>' + logout + "</header>"
        f'<main id="live" data-refresh-ms="{REFRESH_MS}">' + live(view, history) + "</main></body></html>\n"
    )


def live(view: DashboardView, history: Sequence[Point]) -> str:
    """The refreshed part of the page: summary, charts, nodes, GPUs, leases, queue, enforcement."""
    out: List[str] = [f'<div id="generated" data-at="{view.now:.3f}" hidden></div>']
    out.append(_summary(view))
    out.append(_charts(history, view.now))
    if len(view.nodes) > 1:
        out.append(_nodes(view))
    out.append(_gpus(view))
    out.append(_leases(view))
    if view.teams:
        out.append(_teams(view))
    out.append(_queue(view))
    if view.jobs:
        out.append(_jobs(view))
    out.append(_enforcement(view))
    return "".join(out)


def _summary(view: DashboardView) -> str:
    healthy = sum(n.healthy for n in view.nodes)
    gpus = sum(n.gpus for n in view.nodes)
    if view.sampled_at is None:
        sampled = "usage not sampled (no watchdog on this pool)"
    else:
        sampled = f"usage sampled {duration(view.now - view.sampled_at)} ago"
    cards = [
        ("GPUs", f"{gpus}", f"{healthy} healthy" if healthy == gpus else f"{gpus - healthy} UNHEALTHY"),
        (
            "allocated",
            mib(view.allocated_mib),
            f"{_percent(view.allocated_mib, view.total_mib)} of {mib(view.total_mib)}",
        ),
        ("used", mib(view.used_mib), sampled),
        ("leases", f"{view.lease_count}", f"isolation {view.isolation}"),
        ("queued", f"{view.queued}", "claims waiting"),
    ]
    body = "".join(
        f'<div class="card{" bad" if label == "GPUs" and healthy < gpus else ""}"><div class="label">{_e(label)}</div>'
        f'<div class="value">{_e(value)}</div><div class="sub">{_e(sub)}</div></div>'
        for label, value, sub in cards
    )
    return f'<section id="summary" class="cards">{body}</section>'


def _charts(history: Sequence[Point], now: float) -> str:
    memory: List[Series] = [
        (
            "allocated",
            "line-alloc",
            [(p.at, 100.0 * p.allocated_mib / p.total_mib if p.total_mib else 0.0) for p in history],
        ),
        (
            "used",
            "line-used",
            [(p.at, 100.0 * p.used_mib / p.total_mib) for p in history if p.used_mib is not None and p.total_mib],
        ),
    ]
    queue: List[Series] = [("queued", "line-queue", [(p.at, float(p.queued)) for p in history])]
    leases: List[Series] = [("leases", "line-leases", [(p.at, float(p.leases)) for p in history])]
    return (
        '<section id="charts"><h2>Last hour</h2><div class="charts">'
        + _chart("memory, % of the pool", memory, now, fixed_max=100.0)
        + _chart("leases", leases, now)
        + _chart("queue length", queue, now)
        + "</div></section>"
    )


def _chart(title: str, series: Sequence[Series], now: float, fixed_max: Optional[float] = None) -> str:
    """A line chart of the last hour: x from now-3600 s to now, y from 0 to the series' max."""
    width, height = 300.0, 80.0
    values = [v for _, _, points in series for _, v in points]
    top = fixed_max if fixed_max is not None else max([1.0, *values])
    lines = []
    legend = []
    for name, css, points in series:
        coords = " ".join(
            f"{width * (1 - min(3600.0, max(0.0, now - at)) / 3600.0):.1f},{height - height * min(v, top) / top:.1f}"
            for at, v in points
        )
        if coords:
            lines.append(f'<polyline class="{css}" points="{coords}"/>')
        last = f"{points[-1][1]:.0f}" if points else "–"
        legend.append(f'<span class="{css}">{_e(name)} {_e(last)}</span>')
    return (
        f'<figure class="chart"><figcaption>{_e(title)} {"".join(legend)}</figcaption>'
        f'<svg viewBox="0 0 {width:.0f} {height:.0f}" preserveAspectRatio="none" role="img" aria-label="{_e(title)}">'
        f'<line class="axis" x1="0" y1="{height:.0f}" x2="{width:.0f}" y2="{height:.0f}"/>{"".join(lines)}</svg>'
        f'<div class="axis-labels"><span>−60 min</span><span>max {top:g}</span><span>now</span></div></figure>'
    )


def _nodes(view: DashboardView) -> str:
    rows = "".join(
        f"<tr><td>{_e(n.node)}</td><td>{n.gpus}</td>"
        f'<td class="{"ok" if n.healthy == n.gpus else "bad"}">{n.healthy}/{n.gpus}</td>'
        f"<td>{mib(n.allocated_mib)} / {mib(n.total_mib)} ({_percent(n.allocated_mib, n.total_mib)})</td>"
        f"<td>{mib(n.used_mib)}</td></tr>"
        for n in view.nodes
    )
    return (
        '<section id="nodes"><h2>Nodes</h2><table><thead><tr><th>node</th><th>GPUs</th><th>healthy</th>'
        f"<th>allocated</th><th>used</th></tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _gpus(view: DashboardView) -> str:
    rows = "".join(_gpu_row(g) for g in view.gpus)
    return (
        '<section id="gpus"><h2>GPUs</h2><p class="legend"><span class="key l0"></span>allocated to a lease '
        '<span class="key u0"></span>used by its processes <span class="key used"></span>used on the GPU '
        '<span class="key unleased"></span>used by no lease</p>'
        '<table class="gpus"><thead><tr><th>node</th><th>GPU</th><th>model / uuid</th><th>health</th>'
        '<th>util</th><th class="barcol">memory by lease</th><th>allocated</th><th>used</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></section>"
    )


def _gpu_row(g: GpuRow) -> str:
    d = g.device
    health = '<td class="ok">healthy</td>' if d.healthy else '<td class="bad">UNHEALTHY</td>'
    util = "–" if g.utilization is None else f"{100.0 * g.utilization:.0f}%"
    return (
        f'<tr class="gpu" data-uuid="{_e(d.uuid)}"><td>{_e(d.node)}</td><td>{d.index}</td>'
        f'<td>{_e(d.name)}<div class="uuid">{_e(d.uuid)}</div></td>{health}<td>{util}</td>'
        f'<td class="barcol">{_bar(g)}</td>'
        f"<td>{mib(g.allocated_mib)} / {mib(d.memory_mib)}</td><td>{mib(g.used_mib)}</td></tr>"
    )


def _bar(g: GpuRow) -> str:
    """Allocated slices per lease (light), what each lease uses inside them (dark), and below, all use."""
    total = float(g.device.memory_mib) or 1.0
    scale = BAR_W / total
    parts = [
        f'<svg class="bar" viewBox="0 0 {BAR_W:.0f} 24" preserveAspectRatio="none"><rect class="free" width="1000" height="14"/>'
    ]
    x = 0.0
    for s in g.segments:
        w = s.allocated_mib * scale
        c = _color(s.lease_id)
        used = "not sampled" if s.used_mib is None else f"{mib(s.used_mib)} used"
        parts.append(
            f"<g><title>lease {_e(s.lease_id)} ({_e(s.holder)}): {mib(s.allocated_mib)} allocated, {used}</title>"
            f'<rect class="l{c}" x="{x:.1f}" width="{w:.1f}" height="14"/>'
        )
        if s.used_mib:
            over = s.used_mib > s.allocated_mib
            parts.append(
                f'<rect class="{"over" if over else f"u{c}"}" x="{x:.1f}" y="3" '
                f'width="{min(s.used_mib, s.allocated_mib) * scale:.1f}" height="8"/>'
            )
        parts.append("</g>")
        x += w
    if g.used_mib is not None:
        leased = max(0, g.used_mib - g.unleased_mib)
        parts.append(f'<rect class="used" y="16" width="{min(BAR_W, leased * scale):.1f}" height="8"/>')
        if g.unleased_mib:
            parts.append(
                f'<rect class="unleased" x="{min(BAR_W, leased * scale):.1f}" y="16" '
                f'width="{min(BAR_W, g.unleased_mib * scale):.1f}" height="8"><title>{mib(g.unleased_mib)} used by '
                "processes of no lease</title></rect>"
            )
    parts.append("</svg>")
    return "".join(parts)


def _leases(view: DashboardView) -> str:
    shown = len(view.leases)
    if view.query:
        note = f"{view.lease_matches} of {view.lease_count} match “{_e(view.query)}”"
    else:
        note = f"{view.lease_count} live"
    if shown < view.lease_matches:
        note += f"; the newest {shown} shown, filter to find the others"
    rows = "".join(_lease_row(r) for r in view.leases)
    if not rows:
        rows = '<tr><td colspan="8" class="empty">no leases</td></tr>'
    return (
        f'<section id="leases"><h2>Leases <small>{note}</small></h2><table><thead><tr><th>lease</th><th>holder</th>'
        "<th>namespace</th><th>share</th><th>allocated</th><th>used</th><th>age</th><th>expires</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
    )


def _lease_row(r: LeaseRow) -> str:
    if r.used_mib is None:
        used = "–"
    else:
        over = r.used_mib > r.allocated_mib
        used = f'<span class="{"bad" if over else ""}">{mib(r.used_mib)}</span>'
    expires = f"in {duration(r.expires_in_s)}" if r.expires_in_s >= 0 else f"overdue {duration(-r.expires_in_s)}"
    return (
        f'<tr class="lease" data-lease="{_e(r.lease.id)}"><td class="mono">{_e(r.lease.id)}</td>'
        f'<td title="{_e(r.lease.holder.describe())}">{_e(r.holder)}</td><td>{_e(r.namespace) or "–"}</td>'
        f"<td>{_e(r.share)}</td><td>{mib(r.allocated_mib)}</td><td>{used}</td>"
        f"<td>{duration(r.age_s)}</td><td>{expires}</td></tr>"
    )


def _teams(view: DashboardView) -> str:
    """The team queues: quota, weight and limit, what each holds and borrows, claims waiting, preemptions."""
    rows = "".join(
        f"<tr><td>{_e(q.spec.name)}</td><td>{q.spec.quota:g}</td><td>{q.spec.weight:g}</td>"
        f"<td>{'–' if q.spec.limit is None else f'{q.spec.limit:g}'}</td><td>{q.allocated:.2f}</td>"
        f"<td>{q.borrowed:.2f}</td><td>{q.waiting}</td>"
        f"<td>{q.preemptions}</td></tr>"
        for q in view.teams
    )
    return (
        '<section id="teams"><h2>Team queues <small>GPUs; borrowing beyond the quota may be preempted</small></h2>'
        "<table><thead><tr><th>queue</th><th>quota</th><th>weight</th><th>limit</th><th>allocated</th>"
        f"<th>borrowed</th><th>waiting</th><th>preempted</th></tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _queue(view: DashboardView) -> str:
    if not view.queue:
        text = "empty" if view.queued == 0 else f"{view.queued} claim(s) waiting"
        return f'<section id="queue"><h2>Queue</h2><p class="empty">{_e(text)}</p></section>'
    rows = "".join(_queue_row(r) for r in view.queue)
    return (
        '<section id="queue"><h2>Queue <small>oldest first; only the head may be granted</small></h2>'
        "<table><thead><tr><th>#</th><th>holder</th><th>claim</th><th>waiting</th><th>why it waits</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
    )


def _queue_row(r: QueueRow) -> str:
    return (
        f"<tr><td>{r.position}</td><td>{_e(r.holder)}</td><td>{_e(r.claim)}</td>"
        f"<td>{duration(r.waited_s)}</td><td>{_e(r.reason)}</td></tr>"
    )


def _jobs(view: DashboardView) -> str:
    rows = "".join(_job_rows(j, view.now) for j in view.jobs)
    return (
        '<section id="jobs"><h2>Jobs <small>gpupool submit, newest first; the last lines of each log</small></h2>'
        "<table><thead><tr><th>job</th><th>phase</th><th>replica</th><th>status</th><th>restarts</th>"
        f"<th>exit</th><th>log</th></tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _job_rows(job: JobRow, now: float) -> str:
    replicas = job.replicas or ()
    span = max(1, len(replicas))
    phase_class = {"Failed": "bad", "Succeeded": "ok"}.get(job.phase, "")
    head = (
        f'<td rowspan="{span}" class="mono">{_e(job.name)}<div class="uuid">submitted {duration(now - job.submitted_at)} ago'
        f'</div></td><td rowspan="{span}" class="{phase_class}" title="{_e(job.message)}">{_e(job.phase)}</td>'
    )
    if not replicas:
        return f'<tr class="job">{head}<td colspan="5" class="empty">no replicas yet</td></tr>'
    out = []
    for i, r in enumerate(replicas):
        log = "\n".join(r.log_tail)
        out.append(
            f'<tr class="job">{head if i == 0 else ""}<td class="mono">{_e(r.name)}</td><td>{_e(r.status)}</td>'
            f"<td>{r.restarts}</td><td>{'–' if r.exit_code is None else r.exit_code}</td>"
            f'<td><pre class="log">{_e(log)}</pre></td></tr>'
        )
    return "".join(out)


def _enforcement(view: DashboardView) -> str:
    totals = ", ".join(f"{_e(k)}: {v}" for k, v in sorted(view.actions_total.items())) or "none"
    rows = "".join(
        f"<tr><td>{_e(time.strftime('%H:%M:%S', time.localtime(a.at)))}</td><td>{_e(a.reason.value)}</td>"
        f'<td>{_e(a.mode.value)}</td><td>{a.pid}</td><td class="mono">{_e(a.lease_id) or "–"}</td>'
        f"<td>{_e(a.holder) or '–'}</td><td>{mib(a.memory_mib)}</td></tr>"
        for a in view.actions
    )
    unleased = "".join(
        f'<tr><td>{p.pid}</td><td class="mono">{_e(p.device_uuid)}</td><td>{mib(p.memory_mib)}</td></tr>'
        for p in view.unleased
    )
    out = [f'<section id="enforcement"><h2>Enforcement <small>actions since start: {totals}</small></h2>']
    if rows:
        out.append(
            "<table><thead><tr><th>at</th><th>reason</th><th>action</th><th>pid</th><th>lease</th><th>holder</th>"
            f"<th>memory</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    else:
        out.append('<p class="empty">no recent actions</p>')
    if unleased:
        out.append(
            "<h3>Processes of no lease</h3><table><thead><tr><th>pid</th><th>GPU</th><th>memory</th></tr></thead>"
            f"<tbody>{unleased}</tbody></table>"
        )
    out.append("</section>")
    return "".join(out)


def login(error: str = "", auth_hint: str = "") -> str:
    """The sign-in page: one token field; the token becomes an HttpOnly cookie."""
    message = f'<p class="bad" role="alert">{_e(error)}</p>' if error else ""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>gpupool · sign in</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
        f'<link rel="stylesheet" href="{STATIC}/dashboard.css"></head><body class="login">'
        '<form method="post" action="/login"><h1>gpupool</h1>'
        "<p>This pool needs a token (the same as for the API: <code>gpupool token create</code>).</p>"
        f"{message}"
        '<label>Token <input type="password" name="token" autocomplete="current-password" required autofocus></label>'
        f'<button type="submit">Sign in</button><p class="hint">{_e(auth_hint)}</p></form></body></html>\n'
    )
