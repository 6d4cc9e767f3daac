"""The Pool service in one process: claims, holders, expiry, the FIFO queue."""

from __future__ import annotations

import threading
import time

import pytest
from clock import FakeClock
from waiting import wait_until

from gpupool.core.errors import Forbidden, InvalidClaim, NotFound, Unavailable, Unsatisfiable
from gpupool.core.model import Claim, Holder
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool


@pytest.fixture
def pool(tmp_path):
    p = Pool(tmp_path, devices=emulated_devices("emulated:2x16GiB", "n"), node="n")
    yield p
    p.close()


def half(count: int = 1) -> Claim:
    return Claim.single(count, fraction=0.5)


def test_claim_release_and_status(pool):
    lease = pool.claim(half(), Holder("alice"))
    assert [s.memory_mib for s in lease.slices] == [8192]
    status = pool.status()
    assert status.allocated() == {lease.slices[0].device_uuid: 8192}
    assert status.node == "n" and status.queued == 0
    assert pool.lease(lease.id) == lease
    pool.release(lease.id, "alice")
    assert pool.status().leases == ()
    with pytest.raises(NotFound):
        pool.release(lease.id)
    with pytest.raises(NotFound):
        pool.lease(lease.id)


def test_full_pool_is_unavailable_with_reason(pool):
    pool.claim(Claim.single(2, fraction=1.0), Holder("a"))
    with pytest.raises(Unavailable, match="most free: 0MiB"):
        pool.claim(half(), Holder("b"))


def test_unsatisfiable_and_invalid(pool):
    with pytest.raises(Unsatisfiable, match="only 2 of the pool's 2 GPUs"):
        pool.claim(half(3), Holder("a"))
    with pytest.raises(Unsatisfiable):
        pool.claim(Claim.single(1, memory_mib=20000), Holder("a"), wait_s=5)
    with pytest.raises(InvalidClaim):
        pool.claim(half(), Holder("a"), ttl_s=-1)
    with pytest.raises(InvalidClaim):
        pool.claim(half(), Holder("a"), wait_s=float("nan"))
    assert pool.status().leases == ()


def test_holder_checks(pool):
    lease = pool.claim(half(), Holder("alice"))
    with pytest.raises(Forbidden, match="held by 'alice'"):
        pool.heartbeat(lease.id, "bob")
    with pytest.raises(Forbidden):
        pool.release(lease.id, "bob")
    pool.heartbeat(lease.id, "alice")
    pool.release(lease.id, None)  # admin


def test_expiry_and_heartbeat(tmp_path):
    clock = FakeClock()
    pool = Pool(tmp_path, devices=emulated_devices("1x16GiB", "n"), clock=clock)
    lease = pool.claim(Claim.single(1, fraction=1.0), Holder("a"), ttl_s=10)
    clock.now += 8
    renewed = pool.heartbeat(lease.id)
    assert renewed.expires_at == clock.now + 10
    clock.now += 8
    assert pool.expire() == []
    clock.now += 3
    assert pool.status().leases == ()  # past expiry: not shown even before reclaim
    assert [x.id for x in pool.expire()] == [lease.id]
    with pytest.raises(NotFound):
        pool.heartbeat(lease.id)
    # reclaimed memory is grantable again
    pool.claim(Claim.single(1, fraction=1.0), Holder("b"))


def test_expiry_happens_on_every_state_change(tmp_path):
    clock = FakeClock()
    pool = Pool(tmp_path, devices=emulated_devices("1x16GiB", "n"), clock=clock)
    pool.claim(Claim.single(1, fraction=1.0), Holder("a"), ttl_s=1)
    clock.now += 2
    pool.claim(Claim.single(1, fraction=1.0), Holder("b"))  # no explicit expire() needed


def test_persistence_across_reopen(tmp_path):
    pool = Pool(tmp_path, devices=emulated_devices("2x16GiB", "n"))
    lease = pool.claim(half(2), Holder("a"))
    pool.close()
    again = Pool(tmp_path)  # devices come from the database
    assert again.lease(lease.id) == lease
    assert len(again.devices()) == 2


def test_waiting_claim_is_granted_when_room_frees(pool):
    first = pool.claim(Claim.single(2, fraction=1.0), Holder("a"))
    started = time.monotonic()
    threading.Timer(0.3, pool.release, args=(first.id,)).start()
    lease = pool.claim(half(), Holder("b"), wait_s=120)  # far longer than the release takes, however slow
    assert time.monotonic() - started >= 0.3  # granted only once the release came
    assert lease.holder.name == "b"


def test_wait_runs_out(pool):
    pool.claim(Claim.single(2, fraction=1.0), Holder("a"))
    with pytest.raises(Unavailable, match="after waiting 0.2 s"):
        pool.claim(half(), Holder("b"), wait_s=0.2)
    assert pool.status().queued == 0  # the ticket left the queue


def test_fifo_small_claims_cannot_starve_a_big_one(pool):
    """A big claim waiting for whole GPUs blocks later small claims until it is granted."""
    smalls = [pool.claim(Claim.single(1, fraction=0.25), Holder("small")) for _ in range(2)]
    got = {}

    def big() -> None:
        got["big"] = pool.claim(Claim.single(2, fraction=1.0), Holder("big"), wait_s=120)

    waiter = threading.Thread(target=big)
    waiter.start()
    wait_until(lambda: pool.status().queued, 60, "the big claim queued")
    assert pool.status().queued == 1
    # There is room for a small claim, but it must queue behind the big one.
    with pytest.raises(Unavailable, match="waiting in the queue"):
        pool.claim(Claim.single(1, fraction=0.25), Holder("small"))
    for lease in smalls:
        pool.release(lease.id)
    waiter.join(120)
    assert got["big"].holder.name == "big"
    assert pool.status().queued == 0


def test_waiters_are_granted_in_fifo_order(pool):
    blocker = pool.claim(Claim.single(2, fraction=1.0), Holder("x"))
    order = []
    lock = threading.Lock()

    def wait_for(name: str) -> None:
        lease = pool.claim(Claim.single(2, fraction=1.0), Holder(name), wait_s=300)
        with lock:
            order.append(name)
        time.sleep(0.05)  # holds its lease a moment: the next in line waits for it (the order is tested)
        pool.release(lease.id)

    threads = []
    for i in range(4):
        t = threading.Thread(target=wait_for, args=(f"w{i}",))
        t.start()
        threads.append(t)
        wait_until(lambda n=i + 1: pool.status().queued >= n, 60, f"w{i} queued", interval=0.005)
    pool.release(blocker.id)
    for t in threads:
        t.join(300)
    assert order == ["w0", "w1", "w2", "w3"]


def test_concurrent_threads_never_overcommit(pool):
    errors = []
    peak = []

    def worker() -> None:
        try:
            for _ in range(15):
                lease = pool.claim(Claim.single(1, fraction=0.3), Holder("t"), wait_s=10)
                used = pool.status().allocated()
                peak.append(max(used.values()))
                pool.release(lease.id)
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(peak) == 120
    assert max(peak) <= 16384
    assert pool.status().leases == ()


def test_device_health_blocks_new_slices(pool):
    uuid = pool.devices()[0].uuid
    pool.set_device_health({uuid: False})
    lease = pool.claim(half(), Holder("a"))
    assert lease.slices[0].device_uuid != uuid
    with pytest.raises(Unsatisfiable):
        pool.claim(half(2), Holder("a"))


def test_a_pool_that_cannot_find_devices_leaves_no_connection_open(tmp_path, monkeypatch):
    import os

    from gpupool.core.errors import InvalidInput

    def open_db_files():
        fds = os.listdir("/proc/self/fd")
        return [f for f in fds if os.path.realpath(f"/proc/self/fd/{f}").startswith(str(tmp_path))]

    monkeypatch.setenv("GPUPOOL_DEVICES", "emulated:0x16GiB")  # a fresh state dir: devices are discovered
    with pytest.raises(InvalidInput, match="count must be >= 1"):
        Pool(tmp_path)
    assert open_db_files() == []
