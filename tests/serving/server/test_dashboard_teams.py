"""The dashboard's "Team queues" table: shown with queues, absent without, values escaped."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from gpupool.core.model import Claim, GpuRequest, Holder
from gpupool.core.queues import QueueSpec
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool
from gpupool.serving.server.app import create_app


@pytest.fixture
def pool(tmp_path):
    p = Pool(tmp_path / "pool", devices=emulated_devices("2x16GiB", "node-a"))
    yield p
    p.close()


def live(pool) -> str:
    app = create_app(pool, None)
    app.state.dashboard.status_max_age_s = 0.0
    with TestClient(app) as client:
        r = client.get("/ui/live")
    assert r.status_code == 200
    return r.text


def test_the_team_queues_table(pool):
    assert 'id="teams"' not in live(pool)
    pool.set_queue(QueueSpec("team-a", 1.5, weight=2.0))
    pool.claim(Claim((GpuRequest(1, fraction=0.5),), queue="team-a"), Holder("alice", 1, "h", ""))
    text = live(pool)
    assert 'id="teams"' in text
    row = text[text.index('id="teams"') :].split("<tbody>", 1)[1].split("</tr>", 1)[0]
    assert "<td>team-a</td><td>1.5</td><td>2</td><td>–</td><td>0.50</td><td>0.00</td><td>0</td><td>0</td>" in row
