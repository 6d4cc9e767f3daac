"""The dashboard's ranges past the live hour: memory used and queue length from the samples the
server keeps on disk (store/samples.py), one a minute."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from test_dashboard import make_app, polyline
from waiting import wait_until

from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool
from gpupool.pooling.store import samples
from gpupool.serving.server.dashboard.history import Point
from gpupool.serving.server.dashboard.routes import DashboardState
from gpupool.serving.server.dashboard.shapes import CHART_W

POOL_MIB = 2 * 16384


@pytest.fixture
def pool(tmp_path):
    p = Pool(tmp_path / "pool", devices=emulated_devices("2x16GiB", "node-a"))
    yield p
    p.close()


def seed(pool: Pool, now: float, hours_ago: range) -> None:
    """Samples through the store, one a minute over `hours_ago` (a quarter of the memory used, 3 waiting)."""
    with pool.store.write() as tx:
        for hour in hours_ago:
            for minute in range(60):
                at = now - hour * 3600 + 60 * minute
                samples.write(tx, samples.Sample(at, POOL_MIB, POOL_MIB // 2, POOL_MIB // 4, 1, 3))


def older_than_an_hour(points: list, span_s: float) -> list:
    """The points of a chart line that stand for times more than an hour before now."""
    edge = CHART_W * (1 - 3600 / span_s)
    return [(x, y) for x, y in points if x < edge - 0.1]


def test_the_sampler_keeps_one_sample_a_minute(pool):
    state = DashboardState()
    minute = samples.minute_of(time.time())
    point = Point(minute + 1.0, POOL_MIB, 0, None, 0, 0)
    assert state.keep(pool, point)
    assert not state.keep(pool, Point(minute + 50.0, POOL_MIB, 0, None, 0, 0))
    assert state.keep(pool, Point(minute + 61.0, POOL_MIB, 0, None, 0, 0))
    with pool.store.read() as tx:
        assert samples.count(tx) == 2


def test_the_server_keeps_a_sample_from_its_start(pool):
    with TestClient(make_app(pool)):

        def kept() -> int:
            with pool.store.read() as tx:
                return samples.count(tx)

        wait_until(kept, 10.0, "the sampler keeps its first sample")


def test_long_ranges_draw_memory_used_and_queue_length_from_the_disk(pool):
    now = time.time()
    seed(pool, now, range(20, 1, -1))  # 20 h to 2 h ago
    with TestClient(make_app(pool, auth=False)) as c:
        pages = {name: c.get(f"/ui/live?range={name}").text for name in ("1h", "24h", "7d")}
    for name, span_s in (("24h", 86400.0), ("7d", 7 * 86400.0)):
        used = older_than_an_hour(polyline(pages[name], "line-used"), span_s)
        queued = older_than_an_hour(polyline(pages[name], "line-queue", chart=2), span_s)
        assert used and all(y == 60.0 for _, y in used), (name, used)  # 25 % of the pool: y 60 of 80
        assert queued and all(y == 0.0 for _, y in queued), (name, queued)  # 3 waiting, the chart's top
        # 18 hours of samples over the range's 120 buckets: the line spans them
        xs = [x for x, _ in used]
        assert max(xs) - min(xs) >= CHART_W * 17 * 3600 / span_s
    # the last hour is the live samples' alone: nothing read from disk, no queue drawn at 3
    assert "line-used" not in pages["1h"].split('<figure class="chart">')[1].split("</figure>")[0].split("<svg")[1]
    assert all(y == 80.0 for _, y in polyline(pages["1h"], "line-queue", chart=2))
