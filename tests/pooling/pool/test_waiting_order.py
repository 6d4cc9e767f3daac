"""Issue 25: the waiting claims in the order the pool grants them (`Pool.waiting`, the list `gpupool
queue show` prints), with why each waits, and `hold` / `unhold` / `set_priority` of a waiting claim
(`gpupool claim hold|release|priority`), in a pool with queues and one without."""

from __future__ import annotations

from typing import List, Optional

import pytest

from gpupool.core.errors import Forbidden, InvalidInput, NotFound
from gpupool.core.model import Claim, Holder, Lease
from gpupool.core.queues import QueueSpec
from gpupool.core.status import WAIT_BEHIND, WAIT_HELD, WAIT_LIMIT, WAIT_NEXT, WAIT_NO_ROOM
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool, Waiter


def claim(fraction: float = 1.0, queue: str = "", priority: int = 0) -> Claim:
    return Claim.single(1, fraction=fraction, queue=queue, priority=priority)


@pytest.fixture
def pool(tmp_path):
    p = Pool(tmp_path, devices=emulated_devices("emulated:3x16GiB", "n"), node="n")
    yield p
    p.close()


def wait(pool: Pool, c: Claim, who: str = "alice") -> Waiter:
    started = pool.claims.begin(c, Holder(who), wait_s=60)
    assert isinstance(started, Waiter), started
    return started


def grants(pool: Pool, waiters: List[Waiter]) -> List[Optional[Lease]]:
    """One poll of each waiter, as their processes do."""
    return [pool.claims.try_grant(w) for w in waiters]


def tickets(pool: Pool) -> List[int]:
    return [w.ticket for w in pool.waiting()]


def test_two_queues_are_listed_in_the_order_the_pool_then_grants(pool):
    # Quotas 0: nobody preempts, idle GPUs go to the queue holding the least per weight.
    pool.set_queue(QueueSpec("a", 0))
    pool.set_queue(QueueSpec("b", 0))
    blockers = [pool.claim(claim(), Holder("root")) for _ in range(3)]
    a1 = wait(pool, claim(queue="a"))
    b1 = wait(pool, claim(queue="b"))
    a2 = wait(pool, claim(queue="a", priority=5))  # the head of queue a, before the older a1
    listed = pool.waiting()
    assert [w.ticket for w in listed] == [b1.ticket, a2.ticket, a1.ticket]
    assert [w.position for w in listed] == [1, 2, 3]
    assert [w.why for w in listed] == [WAIT_NO_ROOM] * 3
    assert "no room" in listed[0].reason and "2 claim(s) go first" in listed[2].reason
    assert [(w.ticket, w.position) for w in pool.status().waiting] == [(w.ticket, w.position) for w in listed]
    pending = {w.ticket: w for w in (a1, b1, a2)}
    granted: List[int] = []
    for blocker in blockers:  # free one GPU at a time: the listed order is what happens
        pool.release(blocker.id)
        got = [t for t, w in list(pending.items()) if pool.claims.try_grant(w) is not None]
        assert len(got) == 1, got
        granted += got
        del pending[got[0]]
    assert granted == [w.ticket for w in listed]


def test_a_pool_without_queues_lists_priority_then_age_and_who_is_behind_a_larger_claim(pool):
    pool.claim(claim(), Holder("root"))
    pool.claim(claim(), Holder("root"))
    pool.claim(claim(0.5), Holder("root"))
    big = wait(pool, claim(1.0))
    small = wait(pool, claim(0.25))
    urgent = wait(pool, claim(0.25, priority=3))
    listed = pool.waiting()
    assert [w.ticket for w in listed] == [urgent.ticket, big.ticket, small.ticket]
    assert [w.why for w in listed] == [WAIT_NEXT, WAIT_NO_ROOM, WAIT_BEHIND]
    assert grants(pool, [big, small, urgent])[2] is not None  # the head that fits goes at its next poll
    listed = pool.waiting()
    assert [w.why for w in listed] == [WAIT_NO_ROOM, WAIT_BEHIND]
    assert f"behind a larger claim: ticket {big.ticket}" in listed[1].reason
    assert grants(pool, [small]) == [None]  # the room it could use is kept for the larger claim


def test_a_queue_at_its_limit_waits_last_and_says_so(pool):
    pool.set_queue(QueueSpec("a", 1, limit=1))
    pool.set_queue(QueueSpec("b", 1))
    pool.claim(claim(queue="a"), Holder("alice"))
    pool.claim(claim(), Holder("root"))
    pool.claim(claim(), Holder("root"))
    over = wait(pool, claim(queue="a"))
    other = wait(pool, claim(queue="b"))
    listed = pool.waiting()
    assert [w.ticket for w in listed] == [other.ticket, over.ticket]
    assert listed[1].why == WAIT_LIMIT and "over its queue's limit" in listed[1].reason
    assert [w.ticket for w in pool.waiting("a")] == [over.ticket]
    with pytest.raises(NotFound, match="'nope'"):
        pool.waiting("nope")


def test_hold_skips_a_claim_and_release_gives_its_place_back(pool):
    blockers = [pool.claim(claim(), Holder("root")) for _ in range(3)]
    first = wait(pool, claim())
    second = wait(pool, claim())
    third = wait(pool, claim())
    shown = pool.hold(first.ticket, "alice")
    assert shown.held and shown.position == 0 and shown.why == WAIT_HELD
    assert tickets(pool) == [second.ticket, third.ticket, first.ticket]
    pool.release(blockers[0].id)
    assert pool.claims.try_grant(first) is None and "held" in first.reason
    assert pool.claims.try_grant(third) is None
    assert pool.claims.try_grant(second) is not None  # the held claim was passed over
    assert tickets(pool) == [third.ticket, first.ticket]
    back = pool.unhold(str(first.ticket), "alice")
    assert not back.held and back.position == 1  # its ticket is older than the third's: its place again
    assert tickets(pool) == [first.ticket, third.ticket]
    pool.release(blockers[1].id)
    assert pool.claims.try_grant(third) is None and pool.claims.try_grant(first) is not None


def test_priority_reorders_within_the_queue_and_the_lease_gets_it(pool):
    for _ in range(3):
        pool.claim(claim(), Holder("root"))
    older = wait(pool, claim())
    younger = wait(pool, claim())
    assert tickets(pool) == [older.ticket, younger.ticket]
    assert pool.set_priority(younger.ticket, 7).position == 1
    assert tickets(pool) == [younger.ticket, older.ticket]
    pool.release(pool.status().leases[0].id)
    assert pool.claims.try_grant(older) is None
    lease = pool.claims.try_grant(younger)
    assert lease is not None and lease.priority == 7


def test_only_the_holder_or_an_admin_acts_and_an_unknown_id_is_named(pool):
    for _ in range(3):
        pool.claim(claim(), Holder("root"))
    mine = wait(pool, claim(), "alice")
    with pytest.raises(Forbidden, match="'alice', not 'bob'"):
        pool.hold(mine.ticket, "bob")
    with pytest.raises(Forbidden):
        pool.set_priority(mine.ticket, 3, "bob")
    assert pool.hold(mine.ticket, None).held  # None: an admin
    for unknown in (99999, "99999", "abc", -1):
        with pytest.raises(NotFound, match=repr(unknown)):
            pool.unhold(unknown, None)
    with pytest.raises(InvalidInput, match="priority"):
        pool.set_priority(mine.ticket, 10**9)
    with pytest.raises(InvalidInput, match="priority"):
        pool.set_priority(mine.ticket, True)


def test_a_claim_without_a_wait_is_not_refused_for_held_claims_alone(pool):
    for _ in range(2):
        pool.claim(claim(), Holder("root"))
    pool.claim(claim(0.5), Holder("root"))
    waiting = wait(pool, claim())
    pool.hold(waiting.ticket)
    assert isinstance(pool.claims.begin(claim(0.25), Holder("bob")), Lease)


def test_the_exit_code_said_at_release_is_kept_in_the_history(pool):
    said = pool.claim(claim(0.5), Holder("alice"))
    silent = pool.claim(claim(0.5), Holder("alice"))
    pool.release(said.id, "alice", 7)
    pool.release(silent.id)
    by_id = {r.lease_id: r for r in pool.history(0)}
    assert by_id[said.id].exit_code == 7 and by_id[silent.id].exit_code is None
    assert by_id[said.id].to_dict()["exit_code"] == 7
    kept = pool.claim(claim(0.5), Holder("alice"))
    for bad in (256, -1, True, 1.5, "3"):
        with pytest.raises(InvalidInput, match="exit code"):
            pool.release(kept.id, None, bad)  # type: ignore[arg-type]
    assert pool.lease(kept.id).id == kept.id  # a refused release leaves the lease
