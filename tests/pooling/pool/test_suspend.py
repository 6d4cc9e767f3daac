"""Suspend and resume in the pool (real SQLite): each step of the walk, its memory, its rules."""

from __future__ import annotations

import threading
from typing import List, Tuple

import pytest

from gpupool.core.errors import Forbidden, InvalidInput
from gpupool.core.model import RESUMING, RUNNING, SUSPENDED, SUSPENDING, Claim, Holder, Lease
from gpupool.core.queues import QueueSpec
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool


def whole(queue: str = "", grace: float = 5.0) -> Claim:
    return Claim.single(1, fraction=1.0, queue=queue, preempt_grace_s=grace)


@pytest.fixture
def pool(tmp_path):
    p = Pool(tmp_path, devices=emulated_devices("emulated:2x16GiB", "n"), node="n")
    yield p
    p.close()


def allocated(pool: Pool) -> int:
    return sum(pool.status().allocated().values())


def test_owner_suspends_the_memory_goes_back_and_resume_takes_it_again(pool):
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("alice"))
    asked = pool.suspend(lease.id, "alice")
    assert asked.state == SUSPENDING and asked.suspension.by == "owner"
    assert pool.watch(lease.id, 60).state == SUSPENDING  # the runner's cue, at once
    assert allocated(pool) == 8192  # held until the runner says it is parked
    parked = pool.report_parked(lease.id, "alice", host_bytes=123)
    assert parked.state == SUSPENDED and parked.slices == () and allocated(pool) == 0
    assert parked.suspension.parked[0].memory_mib == 8192 and parked.suspension.host_bytes == 123
    # A suspended lease lives on by its heartbeats and resumes only when asked.
    assert pool.heartbeat(lease.id, "alice").state == SUSPENDED
    assert pool.watch(lease.id, 0.3).state == SUSPENDED
    resumed = pool.resume(lease.id, "alice")
    assert resumed.state == RESUMING and resumed.suspension.remap == ()  # the same GPU had room
    assert allocated(pool) == 8192
    back = pool.report_restored(lease.id, "alice")
    assert back.state == RUNNING and back.suspension.suspended_s >= 0
    assert pool.lease(lease.id).slices == lease.slices


def test_another_tenant_may_not_suspend_or_resume(pool):
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("alice"))
    with pytest.raises(Forbidden, match="'bob'"):
        pool.suspend(lease.id, "bob")
    assert pool.suspend(lease.id, None).suspension.by == "admin"
    pool.report_parked(lease.id, "alice")
    with pytest.raises(Forbidden):
        pool.resume(lease.id, "bob")


def test_steps_out_of_order_are_refused_with_the_state(pool):
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("alice"))
    with pytest.raises(InvalidInput, match="running, not suspended"):
        pool.resume(lease.id, "alice")
    with pytest.raises(InvalidInput, match="not suspending"):
        pool.report_parked(lease.id, "alice")
    pool.suspend(lease.id, "alice")
    with pytest.raises(InvalidInput, match="is suspending, not running"):
        pool.suspend(lease.id, "alice")


def test_a_failed_suspend_keeps_the_lease_running_with_the_error(pool):
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("alice"))
    pool.suspend(lease.id, "alice")
    back = pool.report_parked(lease.id, "alice", error="cuda-bindings is not installed")
    assert back.state == RUNNING and "cuda-bindings" in back.suspension.error
    assert allocated(pool) == 8192 and pool.lease(lease.id).state == RUNNING


def test_resume_moves_to_another_gpu_of_the_model_when_its_own_is_taken(pool):
    lease = pool.claim(whole(), Holder("alice"))
    pool.suspend(lease.id, "alice")
    pool.report_parked(lease.id, "alice")
    other = pool.claim(whole(), Holder("bob"))
    if other.slices[0].device_uuid != lease.slices[0].device_uuid:  # placement may pick the other GPU
        pool.release(other.id)
        other = pool.claim(
            Claim.single(1, fraction=1.0, filters=[f"device.uuid={lease.slices[0].device_uuid}"]), Holder("bob")
        )
    resumed = pool.resume(lease.id, "alice")
    assert resumed.state == RESUMING
    ((old, new),) = resumed.suspension.remap
    assert old == lease.slices[0].device_uuid and new == resumed.slices[0].device_uuid != old


def test_a_failed_restore_leaves_it_suspended_and_gives_the_room_back(pool):
    lease = pool.claim(whole(), Holder("alice"))
    pool.suspend(lease.id, "alice")
    pool.report_parked(lease.id, "alice")
    pool.resume(lease.id, "alice")
    failed = pool.report_restored(lease.id, "alice", error="CUDA_ERROR_OUT_OF_MEMORY")
    assert failed.state == SUSPENDED and failed.slices == () and not failed.suspension.want_resume
    assert "OUT_OF_MEMORY" in failed.suspension.error and allocated(pool) == 0


def waiting_to_resume(pool: Pool) -> Tuple[Lease, List[Lease]]:
    """alice's lease suspended and asked to resume while bob's two leases fill both GPUs."""
    first = pool.claim(whole(), Holder("alice"))
    pool.suspend(first.id, "alice")
    pool.report_parked(first.id, "alice")
    both = [pool.claim(whole(), Holder("bob")) for _ in range(2)]
    assert pool.resume(first.id, "alice").state == SUSPENDED  # no room: it holds a ticket
    return first, both


def test_a_suspended_lease_waiting_for_room_goes_before_later_claims(pool):
    first, both = waiting_to_resume(pool)
    got: list = []
    # carol's wait outlasts the test on any machine: she is granted by the second release
    late = threading.Thread(target=lambda: got.append(pool.claim(whole(), Holder("carol"), wait_s=300)))
    late.start()
    pool.release(both[0].id)
    resumed = pool.watch(first.id, 60)
    assert resumed.state == RESUMING
    pool.release(both[1].id)
    late.join(300)
    assert got and got[0].holder.name == "carol"


def test_preemption_suspends_the_borrower_which_resumes_when_room_is_back(tmp_path):
    pool = Pool(tmp_path, devices=emulated_devices("emulated:2x16GiB", "n"), node="n")
    try:
        pool.set_queue(QueueSpec("a", 1))
        pool.set_queue(QueueSpec("b", 1))
        pool.claim(whole("a"), Holder("alice"))
        # a grace no slow machine outlasts: b is granted by the parking, never the reaping
        borrowed = pool.claim(whole("a", grace=120), Holder("alice"))
        got: list = []
        claimer = threading.Thread(target=lambda: got.append(pool.claim(whole("b"), Holder("bob"), wait_s=300)))
        claimer.start()
        watched = pool.watch(borrowed.id, 60)
        assert watched.state == SUSPENDING and watched.preempted_at is not None
        assert watched.suspension.by == "preemption" and watched.suspension.want_resume
        parked = pool.report_parked(borrowed.id, "alice")
        assert parked.preempted_at is None and parked.state == SUSPENDED
        claimer.join(300)
        assert got, "b's claim was granted once the borrower was parked"
        assert pool.watch(borrowed.id, 0.3).state == SUSPENDED  # no room while b runs
        pool.release(got[0].id)
        assert pool.watch(borrowed.id, 60).state == RESUMING
    finally:
        pool.close()


@pytest.mark.parametrize("mode", ["requeue", "kill"])
def test_a_queue_that_does_not_suspend_preempts_as_before_and_says_how(tmp_path, mode):
    pool = Pool(tmp_path, devices=emulated_devices("emulated:2x16GiB", "n"), node="n")
    try:
        pool.set_queue(QueueSpec("a", 1, preempt=mode))
        pool.set_queue(QueueSpec("b", 1))
        pool.claim(whole("a"), Holder("alice"))
        borrowed = pool.claim(whole("a"), Holder("alice"))
        threading.Thread(target=lambda: pool.claim(whole("b"), Holder("bob"), wait_s=0), daemon=True).start()
        watched = pool.watch(borrowed.id, 60)
        assert watched.preempted_at is not None and watched.state == RUNNING
        assert watched.suspension.mode == mode
    finally:
        pool.close()


def test_a_queue_refuses_an_unknown_preempt_mode():
    with pytest.raises(InvalidInput, match="'pause'.*suspend, requeue, kill"):
        QueueSpec("a", 1, preempt="pause")
    with pytest.raises(InvalidInput, match="'x'"):
        QueueSpec.from_dict({"name": "a", "quota": 1, "preempt": "x"})


def test_releasing_a_suspended_lease_that_waits_for_room_gives_its_place_in_the_queue_up(pool):
    first, both = waiting_to_resume(pool)
    assert len(pool.tickets.queue()) == 1
    pool.release(first.id, "alice")
    # Its ticket goes with it: a claim that does not wait is not refused behind a lease that is gone.
    assert pool.tickets.queue() == []
    pool.release(both[0].id)
    assert pool.claim(whole(), Holder("carol")).holder.name == "carol"
