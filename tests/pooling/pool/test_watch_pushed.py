"""A watch is told, not polling (issue 37): the write that releases, suspends or preempts a lease
wakes its watch through the pool's notification path (pool/notify.py). Each test sets the watch's
re-read to LONG_FALLBACK_S and lets the write come once the watch waits: a watch back within
WOKEN_WITHIN_S was woken by the write, not by a re-read. A write by another process, which no
board of this one sees, rings the watch's doorbell (pool/doorbell.py), and without one still
reaches the watch by the re-read."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Callable, Dict

import pytest
from waiting import wait_until

from gpupool.core.errors import GpupoolError, NotFound
from gpupool.core.model import RESUMING, SUSPENDED, SUSPENDING, Claim, Holder
from gpupool.core.queues import QueueSpec
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool, doorbell

LONG_FALLBACK_S = 30.0
WOKEN_WITHIN_S = 10.0  # generous on a loaded machine, and still a third of the fallback


@pytest.fixture
def pool(tmp_path):
    p = Pool(tmp_path, devices=emulated_devices("emulated:2x16GiB", "n"), node="n")
    p.watcher.fallback_s = LONG_FALLBACK_S
    yield p
    p.close()


def watched(pool: Pool, lease_id: str, watch: Callable[[], Any]) -> Dict[str, Any]:
    """Start `watch()` on a thread, wait until it waits on the board; its answer lands in the dict."""
    got: Dict[str, Any] = {}

    def run() -> None:
        try:
            got["lease"] = watch()
        except GpupoolError as err:
            got["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_until(lambda: pool.watcher.board.waiting() == 1, what=f"the watch of {lease_id} to wait")
    got["thread"] = thread
    return got


def answered(got: Dict[str, Any]) -> Dict[str, Any]:
    got["thread"].join(WOKEN_WITHIN_S)
    assert not got["thread"].is_alive(), f"the watch was not woken within {WOKEN_WITHIN_S:g} s: only a re-read"
    return got


def test_the_owner_s_release_wakes_the_watch(pool):
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("alice"))
    got = watched(pool, lease.id, lambda: pool.watch(lease.id, 60))
    pool.release(lease.id, "alice")
    error = answered(got)["error"]
    assert isinstance(error, NotFound) and "released by its owner" in error.message


def test_an_admin_s_release_wakes_the_watch(pool):
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("alice"))
    got = watched(pool, lease.id, lambda: pool.watch(lease.id, 60))
    pool.release(lease.id, None, caller="root")
    error = answered(got)["error"]
    assert isinstance(error, NotFound) and "released by an admin" in error.message


def test_a_suspend_wakes_the_watch(pool):
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("alice"))
    got = watched(pool, lease.id, lambda: pool.watch(lease.id, 60))
    pool.suspend(lease.id, "alice")
    assert answered(got)["lease"].state == SUSPENDING


@pytest.mark.parametrize("mode", ["suspend", "requeue"])
def test_a_preemption_wakes_the_watch(pool, mode):
    pool.set_queue(QueueSpec("a", 1, preempt=mode))
    pool.set_queue(QueueSpec("b", 1))
    pool.claim(Claim.single(1, fraction=1.0, queue="a"), Holder("alice"))
    borrowed = pool.claim(Claim.single(1, fraction=1.0, queue="a", preempt_grace_s=120), Holder("alice"))
    got = watched(pool, borrowed.id, lambda: pool.watch(borrowed.id, 60))
    granted: list = []
    claimer = threading.Thread(
        target=lambda: granted.append(pool.claim(Claim.single(1, fraction=1.0, queue="b"), Holder("bob"), wait_s=300)),
        daemon=True,
    )
    claimer.start()  # preempts the borrower at once, then waits for its GPU
    lease = answered(got)["lease"]
    assert lease.preempted_at is not None
    assert (lease.state == SUSPENDING) == (mode == "suspend")
    pool.release(borrowed.id, "alice")  # as its runner does, once its command stopped
    claimer.join(300)
    assert granted and granted[0].holder.name == "bob"


def test_the_server_s_watch_is_woken_on_its_event_loop(pool):
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("alice"))

    async def disconnected() -> bool:
        return False

    got = watched(pool, lease.id, lambda: asyncio.run(pool.watcher.watch_async(lease.id, 60, disconnected)))
    pool.release(lease.id, "alice")
    assert isinstance(answered(got)["error"], NotFound)


def test_another_process_s_write_rings_the_watch_s_doorbell(tmp_path):
    devices = emulated_devices("emulated:2x16GiB", "n")
    watching, other = Pool(tmp_path, devices=devices, node="n"), Pool(tmp_path, devices=devices, node="n")
    watching.watcher.fallback_s = LONG_FALLBACK_S
    try:  # `other` stands for another process: its own store, and no board of `watching`'s
        lease = watching.claim(Claim.single(1, fraction=0.5), Holder("alice"))
        got = watched(watching, lease.id, lambda: watching.watch(lease.id, 60))
        assert [n.split(".")[0] for n in os.listdir(tmp_path / doorbell.FOLDER)] == [lease.id]
        other.release(lease.id, "alice")
        assert isinstance(answered(got)["error"], NotFound)
        assert os.listdir(tmp_path / doorbell.FOLDER) == []  # the watch took its doorbell down
    finally:
        other.close()
        watching.close()


def test_a_doorbell_left_by_a_killed_watch_goes_at_its_next_ring(tmp_path):
    bell = doorbell.hang(tmp_path, "0123456789abcdef")
    assert bell is not None
    bell.sock.close()  # as kill -9 leaves it: the file, nobody reading it
    doorbell.ring(tmp_path, ["0123456789abcdef"])
    assert os.listdir(tmp_path / doorbell.FOLDER) == []


def test_another_process_s_write_reaches_a_watch_without_a_doorbell_by_the_re_read(tmp_path):
    devices = emulated_devices("emulated:2x16GiB", "n")
    watching, other = Pool(tmp_path, devices=devices, node="n"), Pool(tmp_path, devices=devices, node="n")
    watching.watcher.doorbells = None  # as where none can be hung (a state dir path too long for one)
    try:
        lease = watching.claim(Claim.single(1, fraction=0.5), Holder("alice"))
        got = watched(watching, lease.id, lambda: watching.watch(lease.id, 60))
        other.release(lease.id, "alice")
        assert isinstance(answered(got)["error"], NotFound)  # the embedded fallback re-reads every 0.1 s
    finally:
        other.close()
        watching.close()


def test_closing_the_pool_ends_a_waiting_watch(pool):
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("alice"))
    got = watched(pool, lease.id, lambda: pool.watch(lease.id, 60))
    pool.close()
    assert "closed" in answered(got)["error"].message


def test_room_given_back_resumes_a_waiting_lease_in_that_write_and_wakes_its_watch(pool):
    whole = Claim.single(1, fraction=1.0)
    first = pool.claim(whole, Holder("alice"))
    pool.suspend(first.id, "alice")
    pool.report_parked(first.id, "alice")
    blockers = [pool.claim(whole, Holder("bob")) for _ in range(2)]
    assert pool.resume(first.id, "alice").state == SUSPENDED  # no room: it waits with a ticket
    got = watched(pool, first.id, lambda: pool.watch(first.id, 60))
    pool.release(blockers[0].id, "bob")
    # Placed by the release itself (no watch, no read placed it), and its watch told at once.
    assert pool.lease(first.id).state == RESUMING
    assert answered(got)["lease"].state == RESUMING
