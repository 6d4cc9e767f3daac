"""The dashboard's jobs: phase, replicas and the tail of each log, from the state dir's job files."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from gpupool.jobs.executors.local.dashboard import TAIL_BYTES, job_rows, log_tail, reader
from gpupool.jobs.executors.local.state import JobState, JobStore, ReplicaState
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool
from gpupool.serving.server.app import create_app


@pytest.fixture
def store(tmp_path):
    store = JobStore(tmp_path / "state")
    state = JobState(
        name="digits-ddp",
        status="Running",
        submitted_at=1000.0,
        replicas={
            "worker-1": ReplicaState("worker", 1, "Running", pid=12, restarts=1),
            "worker-0": ReplicaState("worker", 0, "Succeeded", pid=11, exit_code=0),
        },
    )
    store.create("digits-ddp", {"name": "digits-ddp"}, state)
    store.log_path("digits-ddp", "worker-0").write_text("".join(f"epoch {i}\n" for i in range(20)))
    store.log_path("digits-ddp", "worker-1").write_text("loss <script>alert(1)</script>\n")
    store.create("older", {"name": "older"}, JobState(name="older", status="Failed", submitted_at=10.0))
    return store


def test_rows_carry_phase_replicas_and_log_tails(store):
    older, job = job_rows(store)
    assert (older.name, older.phase, older.replicas) == ("older", "Failed", ())
    assert job.phase == "Running" and [r.name for r in job.replicas] == ["worker-0", "worker-1"]
    first, second = job.replicas
    assert first.exit_code == 0 and first.log_tail == tuple(f"epoch {i}" for i in range(15, 20))
    assert second.restarts == 1 and second.log_tail == ("loss <script>alert(1)</script>",)


def test_tail_of_a_big_log_reads_its_end_only(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("x" * (TAIL_BYTES * 3) + "\nlast but one\nlast\n")
    assert log_tail(path, 2) == ("last but one", "last")
    assert log_tail(tmp_path / "missing.log") == ()


def test_the_page_shows_the_jobs_escaped(store, tmp_path):
    pool = Pool(tmp_path / "pool", devices=emulated_devices("1x16GiB", "n"))
    try:
        with TestClient(create_app(pool, None, jobs=reader(store.state_dir))) as client:
            html = client.get("/ui/live").text
        assert html.index('class="mono">digits-ddp') < html.index('class="mono">older')  # newest first
        assert "epoch 19" in html and "epoch 14" not in html
        assert "<script>alert" not in html and "&lt;script&gt;alert(1)" in html

        def broken():
            raise OSError("disk gone")

        with TestClient(create_app(pool, None, jobs=broken)) as client:
            r = client.get("/ui/live")
        assert r.status_code == 200 and 'id="jobs"' not in r.text
    finally:
        pool.close()


def test_gpupool_server_shows_the_jobs_of_its_state_dir(store, server_factory):
    import httpx

    server = server_factory(state=store.state_dir)
    html = httpx.get(server.url + "/ui/live", headers=server.headers()).text
    assert 'class="mono">digits-ddp' in html and "epoch 19" in html
