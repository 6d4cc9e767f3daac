"""The dashboard's routes: `/` (the page), `/ui/live` (what the page refreshes), sign-in, sign-out, static files.

Auth is the API's: the same tokens, checked by the same `LeaseApi.identify`.
A browser cannot send a bearer header on a plain navigation, so a valid token
given once in the sign-in form is kept in an HttpOnly, SameSite=Strict cookie
(Secure under TLS) that these routes alone accept; the /v1 API keeps asking for
the header, so the cookie can never change the pool. The form is taken from this
server's own page only (`_foreign_origin`: another site's form would sign the
browser in as the site's own token, a login CSRF), and a token in the URL
(`/?token=`) is refused: it stays in the browser's history, in proxies' logs
and in Referer headers.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Dict, Optional, Sequence, Tuple
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from .... import __version__
from ....core.errors import NotFound, Unauthorized, shown
from ....core.queues import QueuedClaim
from ....core.status import PoolStatus
from ....pooling.pool import Pool
from ....pooling.store import samples
from ..auth import Identity
from ..handlers import LeaseApi
from . import period, render
from .history import History, Point, point_of
from .period import Period
from .view import JobRow, build

log = logging.getLogger(__name__)

COOKIE = "gpupool_token"
STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_TYPES = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
MAX_QUERY = 200
MAX_FORM = 4096  # a token is ~50 bytes
PERIOD_MAX_AGE_S = 10.0
# No inline script or style, nothing from elsewhere; the page talks to this origin only.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    # No URL of the dashboard reaches another site; the sign-in form's own POST carries this origin
    # (under no-referrer a browser sends `Origin: null`, and the form could not be told from a foreign one).
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

QueueReader = Callable[[Pool], Sequence[QueuedClaim]]
JobsReader = Callable[[], Sequence[JobRow]]


class DashboardState:
    """What the dashboard keeps beside the app: the hour of history, how to read the queue, the last status."""

    def __init__(
        self,
        queue: Optional[QueueReader] = None,
        history: Optional[History] = None,
        status_max_age_s: float = 1.0,
        jobs: Optional[JobsReader] = None,
    ) -> None:
        self.history = history or History()
        self.queue: QueueReader = queue or (lambda pool: pool.tickets.queue())
        self.jobs = jobs  # None: this server shows no jobs (the node agent; jobs live on the submitting host)
        self.status_max_age_s = status_max_age_s
        self._read: Optional[Tuple[float, PoolStatus, Tuple[QueuedClaim, ...]]] = None
        self._lock = threading.Lock()
        self.period_max_age_s = PERIOD_MAX_AGE_S
        self._periods: Dict[str, Tuple[float, Period]] = {}
        self._kept_minute: Optional[int] = None  # the minute of the last sample kept on disk

    def wait_idle(self) -> None:
        """Return once no pool read of this dashboard is running."""
        with self._lock:
            pass

    def status(self, pool: Pool) -> PoolStatus:
        """`pool.status()`, shared by every viewer for up to `status_max_age_s`."""
        return self.read(pool)[0]

    def read(self, pool: Pool) -> Tuple[PoolStatus, Sequence[QueuedClaim]]:
        """The pool's status and queue, shared by every viewer for up to `status_max_age_s`.

        At 10,000 leases one status costs about a third of a second; ten open
        browser tabs must not cost ten. The lock makes concurrent viewers wait
        for the one read instead of each starting its own, and lets the app's
        shutdown wait for a read in flight (`wait_idle`) before the pool closes.
        """
        with self._lock:
            cached = self._read
            if cached is not None and time.monotonic() - cached[0] < self.status_max_age_s:
                return cached[1], cached[2]
            status = pool.status()
            queue = tuple(self.queue(pool))
            self._read = (time.monotonic(), status, queue)
            return status, queue

    def keep(self, pool: Pool, point: Point) -> bool:
        """Keep `point` on disk as its minute's sample (store/samples.py) unless one was kept in that
        minute: the long ranges' memory and queue lines. True when it wrote one."""
        minute = samples.minute_of(point.at)
        if minute == self._kept_minute:
            return False
        sample = samples.Sample(
            point.at, point.total_mib, point.allocated_mib, point.used_mib, point.leases, point.queued
        )
        with pool.store.write() as tx:
            samples.write(tx, sample)
        self._kept_minute = minute
        return True

    def period(self, pool: Pool, status: PoolStatus, name: str, now: float, wall_now: float) -> Period:
        """The range `name` from the lease history, shared by every viewer for up to `period_max_age_s`.

        A week of lease history and sums over every live lease are too much
        for each two-second refresh at 10,000 leases, and GPU-hours over an
        hour or a week barely move in a few seconds.
        """
        with self._lock:
            cached = self._periods.get(name)
            if cached is not None and time.monotonic() - cached[0] < self.period_max_age_s:
                return cached[1]
            fresh = period.read(pool, status, name, now, wall_now)
            self._periods[name] = (time.monotonic(), fresh)
            return fresh


@asynccontextmanager
async def _record_history(app: FastAPI) -> AsyncIterator[None]:
    """Lifespan part: a point of history every period, whether or not anyone looks, and on disk one
    a minute (the ranges past the hour)."""
    state: DashboardState = app.state.dashboard
    api: LeaseApi = app.state.api

    async def record_forever() -> None:
        while True:
            try:
                now = time.time()
                if state.history.due(now):
                    status = await run_in_threadpool(state.status, api.pool)
                    point = state.history.record(status, now)
                    await run_in_threadpool(state.keep, api.pool, point)
            except Exception:
                log.warning("dashboard history: reading the pool or keeping its sample failed", exc_info=True)
            await asyncio.sleep(state.history.period_s)

    task = asyncio.get_running_loop().create_task(record_forever())
    try:
        yield
    finally:
        task.cancel()
        # A status read already in a worker thread outlives the cancel: let it end before the
        # app's owner closes the pool under it.
        await run_in_threadpool(state.wait_idle)


router = APIRouter(tags=["dashboard"], include_in_schema=False, lifespan=_record_history)


def install(app: FastAPI, queue: Optional[QueueReader] = None, jobs: Optional[JobsReader] = None) -> None:
    """Serve the dashboard from `app` (after `app.state.api` is set); `jobs` lists the jobs to show."""
    app.state.dashboard = DashboardState(queue, jobs=jobs)
    app.include_router(router)


def _api(request: Request) -> LeaseApi:
    api: LeaseApi = request.app.state.api
    return api


def _identify(request: Request) -> Identity:
    """The caller from the Authorization header or the dashboard cookie; Unauthorized without either."""
    header = request.headers.get("authorization")
    if not header:
        token = request.cookies.get(COOKIE)
        header = f"Bearer {token}" if token else None
    return _api(request).identify(header)


def _html(request: Request, text: str, status: int = 200, headers: Optional[Dict[str, str]] = None) -> Response:
    """An HTML answer with the security headers, gzipped when the client takes it (pages of 1,000 GPUs are MBs)."""
    body = text.encode("utf-8")
    out = dict(SECURITY_HEADERS, **(headers or {}))
    out["vary"] = "accept-encoding"
    if len(body) > 2048 and "gzip" in request.headers.get("accept-encoding", ""):
        body = gzip.compress(body, compresslevel=5, mtime=0)
        out["content-encoding"] = "gzip"
    return Response(body, status_code=status, media_type="text/html; charset=utf-8", headers=out)


def _redirect(to: str) -> Response:
    return Response(status_code=303, headers=dict(SECURITY_HEADERS, location=to))


def _login_page(request: Request, error: str = "", status: int = 401) -> Response:
    """The sign-in form: 200 when asked for (a browser logs every 4xx page as a console error), `status` with an error."""
    hint = "" if request.url.scheme == "https" else "Served without TLS: the token crosses the network in clear."
    return _html(request, render.login(error, hint), status=status if error else 200)


def _foreign_origin(request: Request) -> Optional[str]:
    """Why a sign-in or sign-out form did not come from this server's own page, or None when it did.

    A browser names the page a POST comes from in Origin (every current one, for every POST), else
    in Referer; neither is a tool's request (curl, a script), which no other site can make a
    browser send. The origin's host and port must be the Host the browser sent here: a proxy in
    front must pass the Host header through.
    """
    source = request.headers.get("origin") or request.headers.get("referer")
    if source is None:
        return None
    host = request.headers.get("host", "").lower()
    if source != "null" and urlsplit(source).netloc.lower() == host:
        return None
    return (
        f"refused: the form came from {shown(source)}, not from this server's own page: sign in at "
        f"{request.url.scheme}://{host}/ (behind a proxy, pass the Host header through)"
    )


def _with_cookie(response: Response, request: Request, token: str) -> Response:
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=request.url.scheme == "https", path="/")
    return response


def _query(request: Request) -> str:
    return request.query_params.get("q", "").strip()[:MAX_QUERY]


def _render(request: Request, whole_page: bool) -> str:
    """Build and draw the dashboard (in a worker thread: at 10,000 leases it takes tens of milliseconds)."""
    api = _api(request)
    state: DashboardState = request.app.state.dashboard
    status, queue = state.read(api.pool)
    now = time.time()
    if state.history.due(now):
        state.history.record(status, now)
    chosen = period.range_of(request.query_params.get("range", ""))
    # The lease history is in the pool's time (its clock); the live samples in this server's.
    span = state.period(api.pool, status, chosen, api.pool.clock(), now)
    view = build(status, now, queue, _query(request), jobs=_jobs(state), period=span)
    points = (*state.history.points(now), point_of(status, now))  # the charts end at this very status
    return render.page(view, points, api.auth is not None) if whole_page else render.live(view, points)


def _jobs(state: DashboardState) -> Sequence[JobRow]:
    if state.jobs is None:
        return ()
    try:
        return state.jobs()
    except Exception:  # the job files are another program's: never fail the page over them
        log.warning("dashboard: reading the jobs failed", exc_info=True)
        return ()


@router.get("/")
async def dashboard(request: Request) -> Response:
    """The dashboard; without a valid token, the sign-in page."""
    if "token" in request.query_params:  # not even checked: it is in the history and the logs now
        return _login_page(
            request,
            "a token in the URL is not accepted (it stays in the browser's history, in logs and in Referer "
            "headers): paste it into this form instead, and revoke it if the URL was shared",
            status=400,
        )
    try:
        _identify(request)
    except Unauthorized:
        return _login_page(request)
    return _html(request, await run_in_threadpool(_render, request, True))


@router.get("/ui/live")
async def live(request: Request) -> Response:
    """The refreshed part of the page; 401 (JSON, as the API) when the token no longer holds."""
    _identify(request)
    return _html(request, await run_in_threadpool(_render, request, False))


@router.post("/login")
async def login(request: Request) -> Response:
    """The sign-in form: a valid token becomes the dashboard cookie."""
    foreign = _foreign_origin(request)
    if foreign is not None:
        return _login_page(request, f"sign-in {foreign}", status=403)
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            return _login_page(request, f"the sign-in form is over {MAX_FORM} bytes: send the token alone")
    form = parse_qs(body.decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0].strip()
    try:
        _api(request).identify(f"Bearer {token}" if token else None)
    except Unauthorized as err:
        return _login_page(request, err.message)
    return _with_cookie(_redirect("/"), request, token)


@router.post("/logout")
async def logout(request: Request) -> Response:
    foreign = _foreign_origin(request)
    if foreign is not None:  # another site may not sign the browser out either
        return _login_page(request, f"sign-out {foreign}", status=403)
    response = _redirect("/")
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response


@router.get("/ui/static/{name}")
async def static(name: str) -> Response:
    """The page's script and style sheet (no auth: the sign-in page needs the style too)."""
    media = STATIC_TYPES.get(name)
    if media is None:
        raise NotFound(f"no dashboard file {name!r}: the dashboard serves {sorted(STATIC_TYPES)}")
    body = await run_in_threadpool((STATIC_DIR / name).read_bytes)
    headers: Dict[str, Any] = {"cache-control": "no-cache", "x-content-type-options": "nosniff"}
    headers["etag"] = f'"{__version__}-{len(body)}"'
    return Response(body, media_type=media, headers=headers)
