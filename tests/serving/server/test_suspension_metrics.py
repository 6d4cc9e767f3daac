"""Suspension in /metrics: leases suspended and their host bytes per queue, suspend/resume seconds."""

from __future__ import annotations

import re

import pytest
from clock import FakeClock
from fastapi.testclient import TestClient

from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool
from gpupool.serving.server.app import create_app

GIB = 2**30


def sample(text: str, series: str) -> float:
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert found, f"{series} not in /metrics"
    return float(found.group(1))


@pytest.fixture
def served(tmp_path):
    clock = FakeClock(1000.0)
    pool = Pool(tmp_path / "pool", devices=emulated_devices("2x16GiB", "n"), clock=clock)
    with TestClient(create_app(pool)) as client:
        yield client, clock
    pool.close()


def test_suspended_leases_host_bytes_and_step_seconds(served):
    client, clock = served
    assert client.put("/v1/queues/team-a", json={"quota": 1}).status_code == 200
    text = client.get("/metrics").text
    assert sample(text, 'gpupool_lease_suspended{queue="team-a"}') == 0  # a series from the start
    assert sample(text, 'gpupool_lease_suspended{queue=""}') == 0
    assert sample(text, "gpupool_suspend_seconds_count") == 0

    claim = {"claim": {"requests": [{"count": 1, "fraction": 0.5}], "queue": "team-a"}}
    lease_id = client.post("/v1/leases", json=claim).json()["id"]
    client.post("/v1/leases", json={"claim": {"requests": [{"count": 1, "fraction": 0.25}]}})
    assert client.post(f"/v1/leases/{lease_id}/suspend", json={}).status_code == 200
    clock.now += 3.0  # the runner takes 3 s to park it
    assert client.post(f"/v1/leases/{lease_id}/parked", json={"host_bytes": 5 * GIB}).status_code == 200

    text = client.get("/metrics").text
    assert sample(text, 'gpupool_lease_suspended{queue="team-a"}') == 1
    assert sample(text, 'gpupool_lease_suspended{queue=""}') == 0
    assert sample(text, 'gpupool_suspended_host_bytes{queue="team-a"}') == 5 * GIB
    assert sample(text, "gpupool_suspend_seconds_count") == 1
    assert sample(text, "gpupool_suspend_seconds_sum") == 3.0
    assert sample(text, 'gpupool_suspend_seconds_bucket{le="2.5"}') == 0
    assert sample(text, 'gpupool_suspend_seconds_bucket{le="5.0"}') == 1

    # A failed restore is no resume: it is not timed, and the lease is still suspended.
    assert client.post(f"/v1/leases/{lease_id}/resume", json={}).status_code == 200
    assert client.post(f"/v1/leases/{lease_id}/restored", json={"error": "out of memory"}).status_code == 200
    assert sample(client.get("/metrics").text, "gpupool_resume_seconds_count") == 0
    assert client.post(f"/v1/leases/{lease_id}/resume", json={}).status_code == 200
    clock.now += 1.5
    assert client.post(f"/v1/leases/{lease_id}/restored", json={}).status_code == 200

    text = client.get("/metrics").text
    assert sample(text, 'gpupool_lease_suspended{queue="team-a"}') == 0
    assert sample(text, 'gpupool_suspended_host_bytes{queue="team-a"}') == 0
    assert sample(text, "gpupool_resume_seconds_count") == 1
    assert sample(text, "gpupool_resume_seconds_sum") == 1.5
    assert sample(text, "gpupool_suspend_seconds_count") == 1
