"""Queues in the pool: quotas, borrowing, preemption of borrowers, reaping, accounting, validation."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import sqlite3
import threading
import time

import pytest
from clock import FakeClock

from gpupool.core.errors import InvalidClaim, InvalidInput, NotFound, Unavailable, Unsatisfiable
from gpupool.core.model import Claim, Holder, Lease
from gpupool.core.queues import PREEMPT_REAP_MARGIN_S, QueueSpec
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool, Waiter


def whole(queue: str, grace: float = 0.5, priority: int = 0) -> Claim:
    return Claim.single(1, fraction=1.0, queue=queue, priority=priority, preempt_grace_s=grace)


@pytest.fixture
def pool(tmp_path):
    p = Pool(tmp_path, devices=emulated_devices("emulated:2x16GiB", "n"), node="n")
    p.set_queue(QueueSpec("a", 1))
    p.set_queue(QueueSpec("b", 1))
    yield p
    p.close()


@pytest.fixture
def clocked(tmp_path):
    clock = FakeClock()
    p = Pool(tmp_path, devices=emulated_devices("emulated:2x16GiB", "n"), node="n", clock=clock)
    p.set_queue(QueueSpec("a", 1))
    p.set_queue(QueueSpec("b", 1))
    yield p, clock
    p.close()


def by_name(pool: Pool) -> dict:
    return {q.spec.name: q for q in pool.queues()}


def test_a_borrows_b_preempts_the_borrowed_lease_and_is_granted_when_it_ends(pool):
    kept = pool.claim(whole("a"), Holder("alice"))
    # Its grace outlasts the test however slow the machine: b gets it by the release, never the reaping.
    borrowed = pool.claim(whole("a", grace=120), Holder("alice"))
    queues = by_name(pool)
    assert queues["a"].allocated == pytest.approx(2.0) and queues["a"].borrowed == pytest.approx(1.0)

    got: list = []
    claimer = threading.Thread(target=lambda: got.append(pool.claim(whole("b"), Holder("bob"), wait_s=0)))
    claimer.start()
    watched = pool.watch(borrowed.id, 60)  # returns as soon as it is preempted
    assert watched.preempted_at is not None and watched.preempt_grace_s == 120
    assert pool.lease(kept.id).preempted_at is None  # within a's quota: never preempted for b
    assert got == []  # b waits for the borrower to stop
    pool.release(borrowed.id, "alice")
    claimer.join(60)
    assert len(got) == 1 and got[0].queue == "b"
    assert got[0].slices[0].device_uuid == borrowed.slices[0].device_uuid
    queues = by_name(pool)
    assert queues["a"].preemptions == 1 and queues["b"].preemptions == 0
    assert queues["a"].borrowed == 0 and queues["b"].allocated == pytest.approx(1.0)


def test_the_youngest_lowest_priority_borrower_is_the_victim(pool):
    pool.set_queue(QueueSpec("a", 0))
    pool.set_queue(QueueSpec("b", 2))
    high = pool.claim(whole("a", priority=5), Holder("alice"))
    low = pool.claim(whole("a"), Holder("alice"))
    started = pool.claims.begin(whole("b"), Holder("bob"))
    assert isinstance(started, Waiter) and started.wait_s >= 0.5 + PREEMPT_REAP_MARGIN_S
    assert pool.lease(low.id).preempted_at is not None
    assert pool.lease(high.id).preempted_at is None  # one victim is all placement needs
    pool.claims.cancel(started)


def test_a_claim_beyond_its_quota_preempts_nobody(pool):
    pool.claim(whole("a"), Holder("alice"))
    pool.claim(whole("b"), Holder("bob"))
    with pytest.raises(Unavailable):
        pool.claim(whole("b"), Holder("bob"))
    assert all(lease.preempted_at is None for lease in pool.status().leases)


def test_a_preempted_lease_nobody_releases_is_reaped_after_grace(clocked):
    pool, clock = clocked
    pool.claim(whole("a", grace=2), Holder("alice"), ttl_s=3600)
    clock.now += 0.5  # the younger one borrows
    victim = pool.claim(whole("a", grace=2), Holder("alice"), ttl_s=3600)
    clock.now += 0.5
    waiter = pool.claims.begin(whole("b"), Holder("bob"))
    assert isinstance(waiter, Waiter)
    assert pool.claims.try_grant(waiter) is None
    # its runner still heartbeats, but that does not keep it past the reaping
    clock.now += 1
    assert pool.heartbeat(victim.id).expires_at == pytest.approx(1001 + 2 + PREEMPT_REAP_MARGIN_S)
    clock.now = 1001 + 2 + PREEMPT_REAP_MARGIN_S + 0.01
    lease = pool.claims.try_grant(waiter)
    assert isinstance(lease, Lease) and lease.queue == "b"
    with pytest.raises(NotFound):
        pool.lease(victim.id)
    assert by_name(pool)["a"].preemptions == 1
    rows = pool.store.connection().execute("SELECT reason, lease_id FROM lease_history").fetchall()
    assert ("preempted", victim.id) in rows


def test_idle_capacity_goes_to_the_queue_holding_least_per_weight(clocked):
    pool, clock = clocked
    pool.set_queue(QueueSpec("a", 0, weight=1))
    pool.set_queue(QueueSpec("b", 0, weight=3))
    quarter = {q: Claim.single(1, fraction=0.25, queue=q) for q in "ab"}
    blocker = pool.claim(Claim.single(2, fraction=1.0), Holder("x"))
    waiters = [pool.claims.begin(quarter[q], Holder(q), wait_s=60) for q in "aabbbb"]
    pool.release(blocker.id)
    granted = []
    for _ in range(6):
        for w in waiters:
            if w not in granted and isinstance(pool.claims.try_grant(w), Lease):
                granted.append(w)
                break
    # weighted max-min: the next quarter goes to the queue with the least held per weight (ties: first come)
    assert [w.claim.queue for w in granted] == ["a", "b", "b", "b", "a", "b"]


def test_limit_caps_what_a_queue_holds(pool):
    pool.set_queue(QueueSpec("a", 1, limit=1))
    pool.claim(whole("a"), Holder("alice"))
    with pytest.raises(Unavailable, match="limit 1"):
        pool.claim(whole("a"), Holder("alice"))
    with pytest.raises(Unsatisfiable, match="at most 1"):
        pool.claim(Claim.single(2, fraction=1.0, queue="a"), Holder("alice"))


def test_usage_accounts_gpu_seconds(clocked):
    pool, clock = clocked
    a = pool.claim(whole("a"), Holder("alice", label="job-1"), ttl_s=3600)
    clock.now += 50
    pool.claim(Claim.single(1, fraction=0.5, queue="b"), Holder("bob"), ttl_s=3600)
    clock.now += 50
    pool.release(a.id)
    clock.now += 100
    rows = {r.key: r for r in pool.usage(since=900)}
    assert rows["a"].gpu_seconds == pytest.approx(100.0, rel=0.02) and rows["a"].leases == 1
    assert rows["b"].gpu_seconds == pytest.approx(75.0, rel=0.02)
    window = {r.key: r.gpu_seconds for r in pool.usage(since=1025, until=1075, by="holder")}
    assert window == pytest.approx({"alice": 50.0, "bob": 12.5})
    assert {r.key for r in pool.usage(since=900, by="label")} == {"job-1", ""}
    with pytest.raises(InvalidInput, match="usage by 'pod'"):
        pool.usage(since=0, by="pod")
    with pytest.raises(InvalidInput, match="since"):
        pool.usage(since=math.nan)


def test_usage_lies_within_the_wall_clock_span_of_the_lease(pool):
    before_claim = time.time()
    lease = pool.claim(Claim.single(1, fraction=0.5, queue="a"), Holder("alice"))
    claimed = time.time()
    time.sleep(0.5)  # GPU time to account
    releasing = time.time()
    pool.release(lease.id)
    released = time.time()
    (row,) = pool.usage(since=before_claim - 1)
    # The lease began inside the claim call and ended inside the release call (half a GPU):
    # bounds that hold however long either call takes on a loaded machine.
    assert 0.5 * (releasing - claimed) <= row.gpu_seconds <= 0.5 * (released - before_claim) + 0.001


def test_queue_validation_and_lifecycle(pool):
    for bad in (math.nan, math.inf, -1, 1e9):
        with pytest.raises(InvalidInput, match="quota"):
            QueueSpec("c", bad)
    with pytest.raises(InvalidInput, match="weight"):
        QueueSpec("c", 0, weight=0)
    with pytest.raises(InvalidInput, match="limit"):
        QueueSpec("c", 1, limit=0.5)
    with pytest.raises(InvalidInput, match="DNS label"):
        QueueSpec("Team A", 1)
    with pytest.raises(InvalidInput, match="sum to 2.5 GPUs"):
        pool.set_queue(QueueSpec("c", 0.5))
    with pytest.raises(InvalidClaim, match="queue 'zzz' does not exist"):
        pool.claim(whole("zzz"), Holder("x"))
    lease = pool.claim(whole("a"), Holder("alice"))
    with pytest.raises(InvalidInput, match="still has 1 lease"):
        pool.delete_queue("a")
    pool.release(lease.id)
    pool.delete_queue("a")
    with pytest.raises(NotFound):
        pool.delete_queue("a")
    assert [q.spec.name for q in pool.queues()] == ["b"]
    assert [q.spec.name for q in pool.status().queues] == ["b"]


def test_a_pool_without_queues_refuses_a_queue_name(tmp_path):
    pool = Pool(tmp_path, devices=emulated_devices("emulated:1x16GiB", "n"), node="n")
    try:
        with pytest.raises(InvalidClaim, match="none yet"):
            pool.claim(whole("a"), Holder("x"))
        assert pool.queues() == [] and pool.status().queues == ()
        lease = pool.claim(Claim.single(1, fraction=0.5, priority=3), Holder("x"))
        assert lease.priority == 3 and lease.queue == ""
    finally:
        pool.close()


def test_watch_times_out_and_says_when_the_lease_is_gone(pool):
    lease = pool.claim(whole("a"), Holder("alice"))
    t = time.monotonic()
    assert pool.watch(lease.id, 0.2).preempted_at is None
    assert time.monotonic() - t >= 0.15
    pool.release(lease.id)
    with pytest.raises(NotFound):
        pool.watch(lease.id, 1)


def _hold_until_preempted(state_dir: str, ready, done, grace: float) -> None:
    """A borrower in its own process: holds a lease, heartbeats, releases as soon as it is preempted.
    Its TTL outlasts the test: its leases end by release or reaping, never expiry."""
    pool = Pool(state_dir)
    pool.claim(whole("a"), Holder("alice"), ttl_s=3600)
    lease = pool.claim(whole("a", grace=grace), Holder("alice"), ttl_s=3600)
    ready.put(lease.id)
    while pool.watch(lease.id, 0.5).preempted_at is None:
        pool.heartbeat(lease.id)
    pool.release(lease.id)
    done.put("released")
    time.sleep(60)  # keeps its within-quota lease until killed


def _spawn_holder(tmp_path, grace: float):
    ctx = mp.get_context("spawn")
    ready, done = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_hold_until_preempted, args=(str(tmp_path), ready, done, grace))
    proc.start()
    return proc, ready.get(timeout=60), done


def _ended_as(pool: Pool, lease_id: str) -> str:
    (reason,) = pool.store.connection().execute("SELECT reason FROM lease_history WHERE lease_id = ?", (lease_id,))
    return str(reason[0])


@pytest.mark.slow
def test_a_borrower_in_another_process_is_told_at_once_and_releases(pool, tmp_path):
    # A grace no slow machine outlasts: the borrower's own release, not the reaping, ends its lease.
    proc, borrowed, done = _spawn_holder(tmp_path, grace=120)
    try:
        started = time.monotonic()
        lease = pool.claim(whole("b", grace=30), Holder("bob"))  # its wait: the grace, though 0 was asked
        assert done.get(timeout=60) == "released"
        print(f"granted {time.monotonic() - started:.2f} s after the claim (the reaping: 120 s + margin)")
        assert lease.queue == "b"
        with pytest.raises(NotFound):
            pool.lease(borrowed)
        assert _ended_as(pool, borrowed) == "released"  # told through watch, and it released
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)


@pytest.mark.slow
def test_a_borrower_killed_mid_preemption_loses_no_lease(pool, tmp_path):
    proc, borrowed, _ = _spawn_holder(tmp_path, grace=0.5)
    os.kill(proc.pid, signal.SIGKILL)  # it will never release: the pool reaps it after the grace
    proc.join(10)
    started = time.monotonic()
    lease = pool.claim(whole("b", grace=0.2), Holder("bob"))
    waited = time.monotonic() - started
    assert lease.queue == "b"
    # reaped after its grace + margin: no sooner, and long before its TTL (3600 s) would end it
    assert 0.5 + PREEMPT_REAP_MARGIN_S - 0.5 <= waited < 600, waited
    leases = {x.id: x for x in pool.status().leases}
    assert borrowed not in leases and len(leases) == 2  # a's within-quota lease stays until its TTL
    assert _ended_as(pool, borrowed) == "preempted"


def test_priority_orders_the_waiting_line_of_a_pool_without_queues(tmp_path):
    pool = Pool(tmp_path, devices=emulated_devices("emulated:1x16GiB", "n"), node="n")
    try:
        blocker = pool.claim(Claim.single(1, fraction=1.0), Holder("x"))
        low = pool.claims.begin(Claim.single(1, fraction=1.0), Holder("low"), wait_s=60)
        high = pool.claims.begin(Claim.single(1, fraction=1.0, priority=5), Holder("high"), wait_s=60)
        assert isinstance(low, Waiter) and isinstance(high, Waiter)
        pool.release(blocker.id)
        assert pool.claims.try_grant(low) is None and "1 earlier claim" in low.reason
        granted = pool.claims.try_grant(high)
        assert granted is not None and granted.priority == 5
    finally:
        pool.close()


def test_the_pool_grace_applies_to_claims_that_give_none(tmp_path):
    with pytest.raises(InvalidClaim, match="preempt_grace_s"):
        Pool(tmp_path, devices=emulated_devices("emulated:1x16GiB", "n"), preempt_grace_s=math.nan)
    pool = Pool(tmp_path, devices=emulated_devices("emulated:1x16GiB", "n"), node="n", preempt_grace_s=7)
    try:
        assert pool.claim(Claim.single(1, fraction=0.5), Holder("x")).preempt_grace_s == 7
        assert pool.claim(Claim.single(1, fraction=0.5, preempt_grace_s=1), Holder("x")).preempt_grace_s == 1
    finally:
        pool.close()


def _statements(pool: Pool, action) -> list:
    """The SQL statements `action` runs on this thread's connection."""
    seen: list = []
    conn = pool.store.connection()
    conn.set_trace_callback(seen.append)
    try:
        action()
    finally:
        conn.set_trace_callback(None)
    return seen


def test_without_queues_a_claim_and_a_release_run_no_queue_queries(tmp_path):
    pool = Pool(tmp_path, devices=emulated_devices("emulated:2x16GiB", "n"), node="n")
    try:
        claim = Claim.single(1, fraction=0.1)
        for _ in range(3):  # past the first claim's histogram write and the view's first build
            pool.release(pool.claim(claim, Holder("x")).id)
        held: list = []
        claimed = _statements(pool, lambda: held.append(pool.claim(claim, Holder("x"))))
        assert [s.split()[0] for s in claimed] == ["BEGIN", "PRAGMA", "INSERT", "INSERT", "COMMIT"]
        released = _statements(pool, lambda: pool.release(held[0].id))
        # the history row is the one statement a release gained
        assert sum("lease_history" in s for s in released) == 1
        assert not any("queues" in s or "tickets" in s for s in claimed + released)
    finally:
        pool.close()


def test_doctor_finds_quotas_above_a_pool_that_shrank_and_damaged_queue_rows(tmp_path):
    from gpupool.pooling.pool.doctor import check_state

    pool = Pool(tmp_path, devices=emulated_devices("emulated:2x16GiB", "n"), node="n")
    pool.set_queue(QueueSpec("a", 1))
    pool.set_queue(QueueSpec("b", 1))
    pool.close()
    assert check_state(tmp_path).healthy
    Pool(tmp_path, devices=emulated_devices("emulated:1x16GiB", "n"), node="n").close()
    with sqlite3.connect(tmp_path / "pool.db") as conn:
        conn.execute("INSERT INTO queues (name, quota, weight, limit_gpus) VALUES ('c', -1, 1, NULL)")
    kinds = {p.kind: p.message for p in check_state(tmp_path).problems}
    assert set(kinds) == {"bad_queue", "quotas_over_pool"}
    assert "quota -1" in kinds["bad_queue"] and "sum to 2 GPUs" in kinds["quotas_over_pool"]


def test_a_waiter_taken_for_dead_queues_again_in_its_own_queue_and_priority(pool):
    pool.claim(whole("a"), Holder("alice"))
    pool.claim(whole("b"), Holder("bob"))
    waiter = pool.claims.begin(whole("b", priority=7), Holder("bob"), wait_s=60)
    assert isinstance(waiter, Waiter)
    with pool.store.write() as tx:
        tx.delete_ticket(waiter.ticket)  # as the sweep does to a waiter silent for TICKET_TTL_S
    old = waiter.ticket
    assert pool.claims.try_grant(waiter) is None
    assert waiter.ticket != old
    with sqlite3.connect(pool.state_dir / "pool.db") as db:
        row = db.execute("SELECT queue, priority FROM tickets WHERE id = ?", (waiter.ticket,)).fetchone()
    assert row == ("b", 7)
    pool.claims.cancel(waiter)


def test_the_history_keeps_what_ended_in_the_retention_window(clocked):
    from gpupool.pooling.pool.service import HISTORY_PRUNE_EVERY_S, HISTORY_RETENTION_S

    pool, clock = clocked
    pool.release(pool.claim(whole("a"), Holder("alice"), ttl_s=3600).id)  # ends at 1000
    clock.now += HISTORY_RETENTION_S - 10
    pool.release(pool.claim(whole("b"), Holder("bob"), ttl_s=3600).id)
    pool.expire()  # prunes what ended over 90 days ago: nothing yet
    clock.now += 20
    pool.expire()  # `a` is now older, but the last prune was under an hour ago
    assert {r.key for r in pool.usage(since=0, until=clock.now)} == {"a", "b"}
    clock.now += HISTORY_PRUNE_EVERY_S
    pool.expire()
    assert [r.key for r in pool.usage(since=0, until=clock.now)] == ["b"]
