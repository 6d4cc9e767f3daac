"""`gpupool usage` and suspension: suspended time is not GPU time (issue 28), ended or live."""

from __future__ import annotations

import pytest
from clock import FakeClock

from gpupool.core.model import Claim, Holder
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool


@pytest.fixture
def timed(tmp_path):
    clock = FakeClock(1000.0)
    pool = Pool(tmp_path, devices=emulated_devices("emulated:2x16GiB", "n"), node="n", clock=clock)
    yield pool, clock
    pool.close()


def suspend_for(pool: Pool, clock: FakeClock, lease_id: str, seconds: float) -> None:
    """Park lease `lease_id` for `seconds`, then resume and restore it (each runner step at once)."""
    pool.suspend(lease_id, "alice")
    pool.report_parked(lease_id, "alice")
    clock.now += seconds
    pool.resume(lease_id, "alice")
    pool.report_restored(lease_id, "alice")


def alice(pool: Pool, since: float = 0.0, until=None) -> float:
    rows = {r.key: r.gpu_seconds for r in pool.usage(since, until, by="holder")}
    return rows.get("alice", 0.0)


def test_a_released_lease_counts_its_time_less_its_suspensions(timed):
    pool, clock = timed
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("alice"), ttl_s=3600)
    clock.now += 100
    suspend_for(pool, clock, lease.id, 300)
    clock.now += 50
    suspend_for(pool, clock, lease.id, 40)  # two suspensions add up
    clock.now += 10
    assert alice(pool) == pytest.approx(0.5 * 160)  # live: 500 s held, 340 s of them suspended
    pool.release(lease.id, "alice")
    clock.now += 1000
    assert alice(pool) == pytest.approx(0.5 * 160)
    (suspended_s,) = pool.store.connection().execute("SELECT suspended_s FROM lease_history").fetchone()
    assert suspended_s == pytest.approx(340)


def test_a_lease_that_ends_suspended_counts_what_it_parked_until_then(timed):
    pool, clock = timed
    lease = pool.claim(Claim.single(1, fraction=0.25), Holder("alice"), ttl_s=3600)
    clock.now += 200
    pool.suspend(lease.id, "alice")
    clock.now += 5  # parking takes 5 s: still GPU time (it holds its memory until parked)
    pool.report_parked(lease.id, "alice")
    clock.now += 600
    assert alice(pool) == pytest.approx(0.25 * 205)  # live and suspended: its parked slice, not 0
    pool.release(lease.id, "alice")
    assert alice(pool) == pytest.approx(0.25 * 205)
    gpus, suspended_s = pool.store.connection().execute("SELECT gpus, suspended_s FROM lease_history").fetchone()
    assert gpus == pytest.approx(0.25) and suspended_s == pytest.approx(600)


def test_a_window_that_clips_a_span_takes_its_suspended_share(timed):
    pool, clock = timed
    lease = pool.claim(Claim.single(1, fraction=1.0), Holder("alice"), ttl_s=3600)
    suspend_for(pool, clock, lease.id, 100)
    clock.now += 100
    pool.release(lease.id, "alice")
    # 200 s held, half suspended: where in the span is not kept, so any part of it counts half.
    assert alice(pool, since=1000, until=1200) == pytest.approx(100)
    assert alice(pool, since=1150, until=1200) == pytest.approx(25)
