"""The web dashboard in-process: sign-in and cookie, what the page shows, the live part, escaping, the queue."""

from __future__ import annotations

import gzip
import time

import pytest
from fastapi.testclient import TestClient
from waiting import wait_until

from gpupool.core.model import MAX_TTL_S, Claim, Device, Holder, Lease, Slice, pod_of_label
from gpupool.core.queues import QueuedClaim
from gpupool.core.status import PoolStatus
from gpupool.core.suspension import RUNNING, SUSPENDED
from gpupool.core.usage import (
    DeviceUsage,
    EnforcementAction,
    EnforceMode,
    ProcessUsage,
    UsageReport,
    Violation,
)
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool
from gpupool.serving.server.app import create_app
from gpupool.serving.server.auth import Authenticator, create_token
from gpupool.serving.server.dashboard import COOKIE, build
from gpupool.serving.server.dashboard import render as draw
from gpupool.serving.server.dashboard.history import History
from gpupool.serving.server.dashboard.view import holder_text

ADMIN = "admin-token-for-tests-0123456789"
H = {"Authorization": f"Bearer {ADMIN}"}
HALF = {"claim": {"requests": [{"count": 1, "fraction": 0.5}]}}


def make_app(pool, auth=True):
    app = create_app(pool, Authenticator(ADMIN, pool.store) if auth else None)
    app.state.dashboard.status_max_age_s = 0.0  # every request sees what the test just did
    return app


@pytest.fixture
def pool(tmp_path):
    p = Pool(tmp_path / "pool", devices=emulated_devices("2x16GiB", "node-a"))
    yield p
    p.close()


@pytest.fixture
def client(pool):
    with TestClient(make_app(pool)) as c:
        yield c


def test_sign_in_with_the_form_sets_an_httponly_cookie(client, pool):
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 200 and 'name="token"' in r.text and "GPU-emu-" not in r.text
    r = client.post("/login", data={"token": "wrong-token-0123456789"}, follow_redirects=False)
    assert r.status_code == 401 and "not valid" in r.text
    alice = create_token(pool.store, "alice")
    r = client.post("/login", data={"token": alice}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    assert f"{COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    r = client.get("/")
    assert r.status_code == 200 and "GPU-emu-" in r.text
    assert client.get("/ui/live").status_code == 200
    # the cookie opens the dashboard only: the API still wants the bearer header
    assert client.get("/v1/status").status_code == 401
    r = client.post("/logout", follow_redirects=False)
    assert r.status_code == 303 and "Max-Age=0" in r.headers["set-cookie"]
    client.cookies.clear()
    assert client.get("/ui/live").status_code == 401
    assert client.get("/ui/live").json()["error"]["code"] == "unauthorized"


def test_a_token_in_the_url_is_refused_and_becomes_no_cookie(client):
    # Issue 34 item 5: a URL keeps the token in the history, in logs and in Referer headers.
    r = client.get(f"/?token={ADMIN}&q=alice", follow_redirects=False)
    assert r.status_code == 400 and "set-cookie" not in r.headers
    assert "not accepted" in r.text and "paste it into this form" in r.text and ADMIN not in r.text
    assert r.headers["referrer-policy"] == "same-origin"  # no dashboard URL reaches another site
    assert client.get("/?q=alice", follow_redirects=False).status_code == 200  # the sign-in form
    assert 'name="token"' in client.get("/?q=alice").text


def test_bearer_header_works_too_and_the_page_is_locked_down(client):
    r = client.get("/", headers=H)
    assert r.status_code == 200
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert r.headers["cache-control"] == "no-store"
    assert "<script>" not in r.text and " style=" not in r.text  # nothing inline: the CSP forbids it
    assert 'href="data:,"' in r.text  # no favicon request, no 404 in the browser's console
    js = client.get("/ui/static/dashboard.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert client.get("/ui/static/dashboard.css").status_code == 200
    assert client.get("/ui/static/../app.py").status_code == 404
    assert client.get("/ui/static/nope.js").status_code == 404


def test_no_auth_pool_serves_the_page_without_sign_in(pool):
    with TestClient(make_app(pool, auth=False)) as c:
        r = c.get("/")
        assert r.status_code == 200 and "Sign out" not in r.text and "GPU-emu-" in r.text


def test_page_shows_gpus_leases_and_their_usage(client, pool):
    r = client.post("/v1/leases", json=dict(HALF, holder={"name": "x", "label": "pod:team-a/train-0:uid-1"}), headers=H)
    lease = r.json()
    uuid = lease["devices"][0]["uuid"]
    usage = UsageReport(
        time.time(),
        devices=(DeviceUsage(uuid, 5000, 0.42),),
        processes=(ProcessUsage(11, uuid, 3000, 0.4, lease["id"]), ProcessUsage(12, uuid, 2000, None, "")),
        actions=(EnforcementAction(time.time(), Violation.UNLEASED, EnforceMode.WARN, 12, uuid, 2000),),
        actions_total={"unleased": 1},
    )
    pool.record_usage(usage)
    html = client.get("/ui/live", headers=H).text
    assert html.count('class="gpu"') == 2
    assert f'data-lease="{lease["id"]}"' in html
    assert "team-a/train-0" in html and ">team-a<" in html  # holder as the pod, namespace column
    assert "42%" in html  # utilisation
    assert "2.93GiB used" in html  # what the lease's processes use, in its bar segment's title
    assert 'class="unleased"' in html and "Processes of no lease" in html
    assert "unleased: 1" in html and ">warn<" in html


def test_a_suspended_lease_shows_its_state_and_what_it_parked(client, pool):
    running = client.post("/v1/leases", json=HALF, headers=H).json()
    parked = client.post("/v1/leases", json=HALF, headers=H).json()
    assert client.post(f"/v1/leases/{parked['id']}/suspend", json={}, headers=H).status_code == 200
    assert client.post(f"/v1/leases/{parked['id']}/parked", json={"host_bytes": 3 << 30}, headers=H).status_code == 200
    html = client.get("/ui/live", headers=H).text
    rows = {row.split('"', 1)[0]: row for row in html.split('data-lease="')[1:]}
    assert f'class="lease-state {SUSPENDED}">{SUSPENDED}</span> <small>3GiB parked</small>' in rows[parked["id"]]
    assert f'class="lease-state {RUNNING}">{RUNNING}</span></td>' in rows[running["id"]]
    # A restore that failed leaves it suspended, marked, with the runner's error in the title.
    client.post(f"/v1/leases/{parked['id']}/resume", json={}, headers=H)
    client.post(f"/v1/leases/{parked['id']}/restored", json={"error": "CUDA_ERROR_OUT_OF_MEMORY"}, headers=H)
    html = client.get("/ui/live", headers=H).text
    assert f'class="lease-state {SUSPENDED} bad" title="CUDA_ERROR_OUT_OF_MEMORY">{SUSPENDED}</span>' in html


def test_live_part_is_gzipped_for_browsers(client):
    for _ in range(30):
        client.post("/v1/leases", json={"claim": {"requests": [{"count": 1, "memory_mib": 100}]}}, headers=H)
    r = client.get("/ui/live", headers=dict(H, **{"accept-encoding": "gzip"}))
    assert r.headers.get("content-encoding") == "gzip"  # httpx decoded it
    assert r.text.count('class="lease"') == 30
    raw = client.get("/ui/live", headers=dict(H, **{"accept-encoding": "identity"}))
    assert "content-encoding" not in raw.headers and len(gzip.compress(raw.content)) < len(raw.content)


def test_everything_from_the_pool_is_escaped(pool):
    evil = "<script>alert(1)</script>"
    status = PoolStatus(
        devices=(Device("GPU-<b>", 0, evil, 1024, node=evil),),
        leases=(
            Lease("l1", Holder(evil, 1, evil, "pod:" + evil + "/" + evil + ":u"), (Slice("GPU-<b>", 512),), 30, 0, 60),
        ),
        node=evil,
    )
    html = draw.page(build(status, 10.0, query=evil), (), auth=True)
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert "GPU-<b>" not in html


def test_filter_and_lease_limit():
    devices = (Device("GPU-0", 0, "emu", 16384),)
    leases = tuple(
        Lease(f"lease{i:03d}", Holder("alice" if i % 2 else "bob", i, "h"), (Slice("GPU-0", 10),), 30, float(i), 99.0)
        for i in range(40)
    )
    view = build(PoolStatus(devices, leases), 50.0, query="ALICE", lease_limit=5)
    assert view.lease_count == 40 and view.lease_matches == 20 and len(view.leases) == 5
    assert [r.lease.id for r in view.leases][0] == "lease039"  # newest first
    assert all(r.holder.startswith("alice@") for r in view.leases)
    html = draw.live(view, ())
    assert "20 of 40 match" in html and "the newest 5 shown" in html
    assert view.gpus[0].allocated_mib == 400 and view.gpus[0].used_mib is None


def test_queue_rows_say_why_each_claim_waits():
    devices = (Device("GPU-0", 0, "emu", 16384),)
    full = (Lease("big", Holder("bob"), (Slice("GPU-0", 16384),), 30, 0.0, 99.0),)
    queue = [
        QueuedClaim(1, Claim.single(1, fraction=0.5), Holder("alice", 5, "h"), 10.0),
        QueuedClaim(2, Claim.single(1, fraction=0.25), Holder("x", 0, "", "pod:ns/p:uid"), 20.0),
    ]
    view = build(PoolStatus(devices, full, queued=2), 30.0, queue)
    head, second = view.queue
    assert head.position == 1 and head.holder == "alice@h:5" and head.waited_s == 20.0
    assert "GPU" in head.reason or "free" in head.reason  # place()'s reason for the head
    assert second.reason == "behind 1 earlier claim(s) (FIFO)" and second.holder == "ns/p"
    html = draw.live(view, ())
    assert "why it waits" in html and "behind 1 earlier" in html


def test_history_charts():
    history = History(period_s=10, span_s=3600)
    status = PoolStatus(
        (Device("GPU-0", 0, "emu", 1000),), (Lease("a", Holder("x"), (Slice("GPU-0", 500),), 30, 0, 99),)
    )
    assert history.due(0.0)
    history.record(status, 0.0)
    assert not history.due(5.0)
    history.record(status, 10.0)
    points = history.points(3000.0)
    assert [p.allocated_mib for p in points] == [500, 500] and points[0].used_mib is None
    assert history.points(3605.0)[0].at == 10.0
    html = draw.live(build(status, 20.0), points)
    assert 'class="line-alloc"' in html and "allocated 50" in html


def test_pod_labels():
    assert pod_of_label("pod:team-a/train-0:0d5c-uid") == ("team-a", "train-0")
    assert pod_of_label("pod:broken") == ("", "")
    assert pod_of_label("job:x") == ("", "")
    assert holder_text(Holder("alice", 7, "h1")) == "alice@h1:7"
    assert holder_text(Holder("alice")) == "alice"


def test_viewers_share_one_status_read(pool):
    from gpupool.serving.server.dashboard import DashboardState

    calls = []
    real = pool.status
    pool.status = lambda: calls.append(1) or real()
    state = DashboardState(status_max_age_s=60)
    assert state.status(pool) is state.status(pool) and len(calls) == 1


def test_an_oversized_sign_in_form_is_refused(client):
    r = client.post("/login", data={"token": "x" * 10000}, follow_redirects=False)
    assert r.status_code == 401 and "over 4096 bytes" in r.text


def test_a_waiting_claim_shows_in_the_queue_with_its_reason(client, pool):
    import threading

    full = []
    for _ in range(2):  # both GPUs full
        whole = {"claim": {"requests": [{"count": 1, "fraction": 1.0}]}, "ttl_s": MAX_TTL_S}  # outlives the test
        answer = client.post("/v1/leases", json=whole, headers=H)
        assert answer.status_code == 201, answer.text
        full.append(answer.json()["id"])
    granted = []
    # The claim waits until the test frees a GPU (its wait far longer than any render): the page
    # is checked while it certainly still waits, however slow the machine.
    waiting = threading.Thread(
        target=lambda: granted.append(pool.claim(Claim.single(1, fraction=0.5), Holder("carol", 9, "h"), 300))
    )
    waiting.start()
    try:
        (queued,) = wait_until(pool.tickets.queue, 60, "carol's claim in the queue")
        assert queued.holder.name == "carol" and queued.claim.requests[0].fraction == 0.5
        html = client.get("/ui/live", headers=H).text
        assert "why it waits" in html and "carol@h:9" in html and "1 GPU(s) with 0.5 of the memory each" in html
    finally:
        pool.release(full[0])  # the GPU carol waits for
        waiting.join(60)
    assert not waiting.is_alive() and len(granted) == 1 and granted[0].holder.name == "carol"
    assert pool.tickets.queue() == []


def test_the_cookie_is_secure_under_tls(pool):
    with TestClient(make_app(pool), base_url="https://testserver") as c:
        r = c.post("/login", data={"token": ADMIN}, follow_redirects=False)
        assert r.status_code == 303 and "Secure" in r.headers["set-cookie"]
        assert "GPU-emu-" in c.get("/").text  # the Secure cookie goes back over https
        c.cookies.clear()
        assert "without TLS" not in c.get("/").text  # the sign-in page warns only over plain http
    with TestClient(make_app(pool)) as c:
        assert "without TLS" in c.get("/").text
        assert "Secure" not in c.post("/login", data={"token": ADMIN}, follow_redirects=False).headers["set-cookie"]


def lease_cells(html: str, lease_id: str) -> dict:
    """The cells of one lease's row, by column header."""
    table = html[html.index('<section id="leases"') :]
    headers = [h.split("<")[0] for h in table.split("<thead>", 1)[1].split("</thead>", 1)[0].split("<th>")[1:]]
    row = table.split(f'data-lease="{lease_id}">', 1)[1].split("</tr>", 1)[0]
    cells = [c.split("</td>", 1)[0] for c in row.split("<td")[1:]]
    return dict(zip(headers, [c.split(">", 1)[1] for c in cells]))


def test_a_job_lease_shows_its_job_label_queue_share_used_and_age(client, pool):
    from gpupool.core.model import GpuRequest
    from gpupool.core.queues import QueueSpec

    pool.set_queue(QueueSpec("team-a", 1.0))
    job = pool.claim(Claim((GpuRequest(1, fraction=0.5),), queue="team-a"), Holder("alice", 24136, "vm", "job/mnist"))
    plain = pool.claim(Claim.single(1, memory_mib=1024), Holder("bob", 7, "h", "notebook"))
    uuid = job.slices[0].device_uuid
    pool.record_usage(
        UsageReport(time.time(), (DeviceUsage(uuid, 3072, 0.1),), (ProcessUsage(5, uuid, 3072, 0.1, job.id),))
    )
    html = client.get("/ui/live", headers=H).text
    cells = lease_cells(html, job.id)
    assert cells["holder"] == "alice" and "24136" not in cells["holder"]  # the job, not alice@vm:24136
    assert cells["job"] == "mnist" and cells["label"] == "job/mnist" and cells["queue"] == "team-a"
    assert cells["share"].startswith("node-a/GPU") and cells["share"].endswith(" 50% 8GiB")
    assert (
        "3GiB" in cells["used"] and cells["age"].endswith("s") and cells["state"].startswith('<span class="lease-state')
    )
    other = lease_cells(html, plain.id)
    assert (
        other["job"] == "–" and other["label"] == "notebook" and other["queue"] == "–" and other["holder"] == "bob@h:7"
    )
    assert "1GiB" in other["share"]
    assert "1 of 2 match" in client.get("/ui/live?q=team-a", headers=H).text  # the filter reads queues too


def test_lease_colours_are_never_the_red_of_trouble_and_each_row_has_its_key(client, pool):
    import colorsys
    import re
    from pathlib import Path

    from gpupool.serving.server.dashboard import palette

    css = (Path(draw.__file__).parent / "static" / "dashboard.css").read_text()

    def hue(colour: str) -> float:
        if colour.startswith("hsl("):
            return float(colour[4:].split(",")[0])
        r, g, b = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
        return 360.0 * colorsys.rgb_to_hls(r, g, b)[0]

    reds = [hue(re.search(rf"--{name}: (#[0-9a-f]{{6}})", css).group(1)) for name in ("unleased", "bad")]
    found = dict(re.findall(r"\.([lu]\d+) \{ fill: (hsl\([^)]*\)|#[0-9a-f]{6})", css))
    assert {f"{k}{i}" for k in "lu" for i in range(palette.COLORS)} <= set(found)
    for name, colour in found.items():
        for red in reds:
            apart = abs(hue(colour) - red) % 360
            assert min(apart, 360 - apart) >= 40, f".{name} {colour} is too close to the red of trouble"
        assert f"background: {colour}" in css.split(f".{name} {{", 1)[1].split("}", 1)[0]  # the legend's key shows it
    hues = [hue(found[f"l{i}"]) for i in range(palette.COLORS)]
    assert min(min(abs(a - b) % 360, 360 - abs(a - b) % 360) for a in hues for b in hues if a is not b) >= 20

    lease = client.post("/v1/leases", json=HALF, headers=H).json()
    html = client.get("/ui/live", headers=H).text
    colour = palette.lease_color(lease["id"])
    assert f'<span class="key l{colour}"></span>{lease["id"]}' in html  # the row's key ...
    assert f'class="l{colour}" x="0.0"' in html  # ... is its slice's colour in the GPU bar
    assert 'class="key unleased"></span>used by no lease' in html and 'class="key over"' in html


def polyline(html: str, css: str, chart: int = 0) -> list:
    """The (x, y) points of the `css` line in chart number `chart` of the page."""
    figure = html.split('<figure class="chart">')[1 + chart].split("</figure>", 1)[0]
    points = figure.split(f'<polyline class="{css}" points="', 1)[1].split('"', 1)[0]
    return [tuple(float(v) for v in p.split(",")) for p in points.split()]


def axis(page: str) -> list:
    """The time axis' labels of the first chart."""
    import re

    return re.findall(r"<span>([^<]*)</span>", page.split('class="axis-labels time-axis">', 1)[1].split("</div>", 1)[0])


def test_a_range_draws_the_lease_history_with_a_time_axis_and_gpu_hours(tmp_path):
    import re

    from gpupool.core.model import GpuRequest
    from gpupool.core.queues import QueueSpec

    now = time.time()
    clock = [now - 20 * 3600]
    pool = Pool(tmp_path / "pool", devices=emulated_devices("2x16GiB", "node-a"), clock=lambda: clock[0])
    try:
        pool.set_queue(QueueSpec("team-a", 1.0))
        a = pool.claim(Claim((GpuRequest(1, fraction=1.0),), queue="team-a"), Holder("alice", 1, "h"), ttl_s=86400)
        clock[0] = now - 18 * 3600
        pool.release(a.id)  # one GPU from 20 h to 18 h ago: 2 GPU-hours in team-a
        clock[0] = now - 3 * 3600
        b = pool.claim(Claim.single(1, fraction=0.5), Holder("bob", 2, "h"), ttl_s=86400)
        clock[0] = now - 1.5 * 3600
        pool.release(b.id)  # half a GPU from 3 h to 1.5 h ago: 0.75 GPU-hours in the default queue
        clock[0] = now
        with TestClient(make_app(pool, auth=False)) as c:
            pages = {name: c.get(f"/ui/live?range={name}").text for name in ("15m", "1h", "24h", "7d", "bogus")}
    finally:
        pool.close()

    day = pages["24h"]
    assert 'class="range on" data-range="24h"' in day and "Over the last <span" in day and "24 hours" in day
    queues = day.split('class="usage-by-queue"', 1)[1].split("</table>", 1)[0]
    holders = day.split('class="usage-by-holder"', 1)[1].split("</table>", 1)[0]
    assert '<td>team-a</td><td class="gpu-hours">2.00</td><td>1</td>' in queues
    assert '<td>–</td><td class="gpu-hours">0.75</td><td>1</td>' in queues
    assert (
        '<td>alice</td><td class="gpu-hours">2.00</td>' in holders
        and '<td>bob</td><td class="gpu-hours">0.75</td>' in holders
    )
    # x runs over the 24 hours (0 to 300): one GPU of two (50 %, y 40 of 80) from 20 h to 18 h ago
    held = [x for x, y in polyline(day, "line-alloc") if y == 40.0]
    assert held and 50.0 <= min(held) <= 56.0 and 69.0 <= max(held) <= 75.0
    bob = [y for x, y in polyline(day, "line-alloc") if 262.5 < x <= 280.0]  # 3 h to 1.6 h ago: a quarter
    late = [y for x, y in polyline(day, "line-alloc") if x >= 285.0]  # the last 1.2 hours: nothing held
    assert bob == [60.0] * len(bob) and len(bob) == 7 and late == [80.0] * len(late) and late
    assert len(axis(day)) == 5 and all(re.fullmatch(r"\d\d:\d\d", t) for t in axis(day))
    assert all(re.fullmatch(r"\w{3} \d\d:\d\d", t) for t in axis(pages["7d"]))
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in axis(pages["15m"]))
    # the last hour spans the chart (it squeezed minutes of live samples to the right edge), and held nothing
    hour = polyline(pages["1h"], "line-alloc")
    assert min(x for x, _ in hour) < 10.0 and all(y == 80.0 for _, y in hour)
    assert "no use in this range" in pages["1h"].split('id="usage"', 1)[1]
    assert 'class="range on" data-range="1h"' in pages["bogus"]  # an unknown range is the default
    assert pages["7d"].count('class="gpu-hours">2.00<') == 2  # queue and holder: the 7 days hold the same


def test_buckets_average_each_span_over_the_buckets_it_covers():
    from gpupool.serving.server.dashboard.period import buckets

    gpus, leases = buckets([(10.0, 35.0, 2.0), (0.0, 100.0, 0.5), (-50.0, -10.0, 9.0)], 0.0, 100.0, 4)
    assert [t for t, _ in gpus] == [25.0, 50.0, 75.0, 100.0]
    assert [v for _, v in gpus] == pytest.approx([0.5 + 2.0 * 15 / 25, 0.5 + 2.0 * 10 / 25, 0.5, 0.5])
    assert [v for _, v in leases] == pytest.approx([1.0 + 15 / 25, 1.0 + 10 / 25, 1.0, 1.0])


def test_the_usage_panel_sums_as_pool_usage_does(tmp_path):
    from gpupool.serving.server.dashboard import period

    now = time.time()
    clock = [now - 7200]
    pool = Pool(tmp_path / "pool", devices=emulated_devices("2x16GiB", "node-a"), clock=lambda: clock[0])
    try:
        ended = pool.claim(Claim.single(1, fraction=0.25), Holder("carol", 3, "h", "nb"), ttl_s=86400)
        pool.claim(Claim.single(2, fraction=0.5), Holder("dave", 4, "h"), ttl_s=86400)
        clock[0] = now - 1800
        pool.release(ended.id)
        parked = pool.claim(Claim.single(1, fraction=0.25), Holder("erin", 5, "h"), ttl_s=86400)
        clock[0] = now - 600
        pool.suspend(parked.id)
        clock[0] = now
        for name, span in period.RANGES.items():
            got = period.read(pool, pool.status(), name, now)
            for rows, by in ((got.by_queue, "queue"), (got.by_holder, "holder")):
                want = pool.usage(now - span, now, by)
                assert [(r.key, r.leases) for r in rows] == [(r.key, r.leases) for r in want], (name, by)
                assert [r.gpu_seconds for r in rows] == pytest.approx([r.gpu_seconds for r in want]), (name, by)
            assert [r.key for r in got.by_holder] == (["dave", "carol", "erin"] if span > 1800 else ["dave", "erin"])
    finally:
        pool.close()
