"""Issue 23 (2, 3): a server's downtime is no holder's fault, at the pool level (pool/renewal.py).

A serving pool stamps each sweep; the next serving open renews what was live at the stamp. The
embedded pool (every `gpupool run` opens the database) renews nothing. A claim's key finds its
ticket or its lease again.
"""

from __future__ import annotations

from clock import FakeClock

from gpupool.core.model import Claim, Device, Holder
from gpupool.core.outage import TICKET_REATTACH_S
from gpupool.core.queues import QueueSpec, reap_at
from gpupool.pooling.pool import Pool
from gpupool.pooling.pool.renewal import stamp_alive

DEVICES = [Device(f"GPU-{i}", i, "emulated", 16384, "n1") for i in range(2)]


def serving(path, clock, **kw) -> Pool:
    return Pool(path, devices=DEVICES, clock=clock, serving=True, **kw)


def test_a_lease_live_at_the_stop_gets_a_full_ttl_from_the_return(tmp_path):
    clock = FakeClock()
    pool = serving(tmp_path, clock)
    live = pool.claim(Claim.single(1, fraction=0.5), Holder("a"), ttl_s=12)
    clock.now += 8
    pool.heartbeat(live.id)  # expires at 1020
    pool.expire()  # the last sweep: stamp 1008
    pool.close()
    clock.now += 20  # 20 s down: past its expiry
    again = serving(tmp_path, clock)
    lease = again.lease(live.id)
    assert lease.expires_at == clock.now + 12
    assert again.expire() == []


def test_a_lease_already_dead_at_the_stop_is_reaped_not_revived(tmp_path):
    clock = FakeClock()
    pool = serving(tmp_path, clock)
    dead = pool.claim(Claim.single(1, fraction=0.5), Holder("gone"), ttl_s=2)
    live = pool.claim(Claim.single(1, fraction=0.5), Holder("here"), ttl_s=30)
    clock.now += 5  # `dead` ran out while the server ran; the kill came before its sweep reaped it
    with pool.store.write() as tx:  # the last sweep's stamp, without the sweep's reaping
        stamp_alive(tx, clock.now)
    pool.close()
    clock.now += 60
    again = serving(tmp_path, clock)
    assert [x.id for x in again.expire()] == [dead.id]
    assert again.lease(live.id).expires_at == clock.now + 30


def test_the_embedded_pool_renews_nothing(tmp_path):
    clock = FakeClock()
    pool = serving(tmp_path, clock)
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("a"), ttl_s=5)
    pool.expire()
    pool.close()
    clock.now += 10
    embedded = Pool(tmp_path, clock=clock)  # what every `gpupool run` without a server opens
    assert [x.id for x in embedded.expire()] == [lease.id]


def test_a_preempted_lease_keeps_the_time_it_had_to_stop(tmp_path):
    clock = FakeClock()
    pool = serving(tmp_path, clock)
    pool.set_queue(QueueSpec("a", quota=1))
    pool.set_queue(QueueSpec("b", quota=1))
    borrower = pool.claim(Claim.single(2, fraction=1.0, queue="b"), Holder("b"), ttl_s=30)
    started = pool.claims.begin(Claim.single(1, fraction=1.0, queue="a"), Holder("a"), wait_s=60, key="k" * 32)
    assert not hasattr(started, "slices")
    victim = pool.lease(borrower.id)
    assert victim.preempted_at == clock.now
    left = reap_at(victim) - clock.now
    pool.expire()
    pool.close()
    clock.now += 40  # down longer than its grace
    again = serving(tmp_path, clock)
    moved = again.lease(borrower.id)
    assert moved.preempted_at == victim.preempted_at + 40
    assert reap_at(moved) - clock.now == left
    # the claim it was preempted for keeps its ticket, and the client re-attaches to it
    back = again.claims.begin(Claim.single(1, fraction=1.0, queue="a"), Holder("a"), wait_s=60, key="k" * 32)
    assert getattr(back, "ticket", None) == started.ticket


def test_a_keyed_ticket_keeps_its_place_and_a_keyless_one_of_the_dead_server_goes(tmp_path):
    clock = FakeClock()
    pool = serving(tmp_path, clock)
    holder = pool.claim(Claim.single(2, fraction=1.0), Holder("full"), ttl_s=30)
    first = pool.claims.begin(Claim.single(1, fraction=0.5), Holder("b"), wait_s=60, key="b" * 32)
    old = pool.claims.begin(Claim.single(1, fraction=0.5), Holder("old"), wait_s=60)  # a client without keys
    pool.expire()
    with pool.store.write() as tx:  # as if another process (the server killed now) held them
        tx.conn.execute("UPDATE tickets SET pid = 999999999")
    pool.close()
    clock.now += 10
    again = serving(tmp_path, clock)
    later = again.claims.begin(Claim.single(1, fraction=0.5), Holder("c"), wait_s=60, key="c" * 32)
    with again.store.read() as tx:
        tickets = {t[0]: t for t in tx.tickets()}
    assert set(tickets) == {first.ticket, later.ticket}, "the keyless ticket of the dead server is dropped"
    assert tickets[first.ticket][3] == clock.now + TICKET_REATTACH_S
    again.release(holder.id)
    assert again.claims.try_grant(later) is None, "the later claim may not pass the kept one"
    back = again.claims.begin(Claim.single(1, fraction=0.5), Holder("b"), wait_s=60, key="b" * 32)
    assert back.ticket == first.ticket
    assert again.claims.try_grant(back) is not None
    assert old.ticket not in tickets


def test_a_kept_ticket_whose_client_never_comes_back_expires(tmp_path):
    clock = FakeClock()
    pool = serving(tmp_path, clock)
    pool.claim(Claim.single(2, fraction=1.0), Holder("full"), ttl_s=600)
    pool.claims.begin(Claim.single(1, fraction=0.5), Holder("b"), wait_s=60, key="b" * 32)
    pool.expire()
    pool.close()
    again = serving(tmp_path, clock)
    clock.now += TICKET_REATTACH_S + 1
    again.expire()
    assert again.status().queued == 0


def test_a_retry_with_the_key_gets_the_lease_granted_to_it(tmp_path):
    pool = Pool(tmp_path, devices=DEVICES)
    first = pool.claim(Claim.single(1, fraction=0.5), Holder("a"), key="a" * 32)
    assert pool.claim(Claim.single(1, fraction=0.5), Holder("a"), key="a" * 32).id == first.id
    # another holder with the same key gets a lease of its own, never someone else's
    other = pool.claim(Claim.single(1, fraction=0.5), Holder("z"), key="a" * 32)
    assert other.id != first.id
    assert len(pool.status().leases) == 2


def test_a_preemption_whose_claim_did_not_outlive_the_stop_is_undone(tmp_path):
    clock = FakeClock()
    pool = serving(tmp_path, clock)
    pool.set_queue(QueueSpec("a", quota=1))
    pool.set_queue(QueueSpec("b", quota=1))
    borrower = pool.claim(Claim.single(2, fraction=1.0, queue="b"), Holder("b"), ttl_s=30)
    pool.claims.begin(Claim.single(1, fraction=1.0, queue="a"), Holder("a"), wait_s=60)  # a client without keys
    assert pool.lease(borrower.id).preempted_at is not None
    pool.expire()
    pool.close()
    clock.now += 10
    again = serving(tmp_path, clock)
    lease = again.lease(borrower.id)
    assert lease.preempted_at is None, "no claim is left to take its room: the preemption is undone"
    assert lease.expires_at == clock.now + 30
