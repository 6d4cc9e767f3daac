"""core.queues: queue specs, borrowing, the admission order, victims of preemption, usage sums."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.errors import InvalidClaim, InvalidInput
from gpupool.core.model import Claim, Device, Holder, Lease, Slice, allocated_by_device
from gpupool.core.placement import place
from gpupool.core.queues import (
    QueueLoad,
    QueueSpec,
    QueueStatus,
    UsageRow,
    UsageSpan,
    Waiting,
    admission_order,
    borrowed_ids,
    borrowers,
    check_quotas_fit,
    choose_victims,
    claim_gpus,
    next_ticket,
    usage_rows,
)
from gpupool.core.status import PoolStatus

GPUS = [Device(f"G{i}", i, "emu", 1000) for i in range(4)]


def lease(lease_id: str, queue: str, device: str = "G0", mib: int = 1000, created: float = 0.0, priority: int = 0):
    return Lease(lease_id, Holder("h"), (Slice(device, mib),), 60.0, created, created + 60, queue, priority)


# --- specs and wire format ----------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"quota": math.nan}, "quota nan is out of range"),
        ({"quota": math.inf}, "quota inf is out of range"),
        ({"quota": -1}, "quota -1 is out of range"),
        ({"quota": 1e7}, "out of range"),
        ({"quota": "1"}, "quota '1' is not a number"),
        ({"quota": 1, "weight": 0}, "weight 0"),
        ({"quota": 1, "weight": math.nan}, "weight nan"),
        ({"quota": 2, "limit": 1}, "limit 1 is below its quota 2"),
        ({"quota": 1, "limit": math.inf}, "limit inf"),
    ],
)
def test_queue_spec_refuses_bad_numbers_in_one_line(kwargs, message):
    with pytest.raises(InvalidInput, match=message) as err:
        QueueSpec("team-a", **kwargs)
    assert "\n" not in err.value.message and "team-a" in err.value.message


@pytest.mark.parametrize("name", ["", "A", "-a", "a-", "a_b", "x" * 64, 3])
def test_queue_names_are_dns_labels(name):
    with pytest.raises(InvalidInput, match="DNS label"):
        QueueSpec(name, 1)  # type: ignore[arg-type]
    if name != "":  # a claim's "" is no queue
        with pytest.raises(InvalidClaim, match="DNS label"):
            Claim.single(1, fraction=0.5, queue=name)  # type: ignore[arg-type]


def test_spec_status_and_usage_round_trip():
    spec = QueueSpec("a", 1.5, 2, 3)
    assert QueueSpec.from_dict(spec.to_dict()) == spec
    assert QueueSpec.from_dict(QueueSpec("b", 1, preempt="kill").to_dict()).preempt == "kill"
    assert QueueSpec.from_dict({"name": "c", "quota": 1, "idle_suspend_s": 600}).idle_suspend_s == 600.0
    with pytest.raises(InvalidInput, match="idle_suspend_s 0.5 must be"):
        QueueSpec("d", 1, idle_suspend_s=0.5)
    assert QueueSpec.from_dict({"name": "a", "quota": 1}) == QueueSpec("a", 1.0)
    with pytest.raises(InvalidInput, match="unknown queue field"):
        QueueSpec.from_dict({"name": "a", "quota": 1, "quote": 2})
    with pytest.raises(InvalidInput, match="no quota"):
        QueueSpec.from_dict({"name": "a"})
    timed = QueueSpec.from_dict({"name": "t", "quota": 1, "default_time_s": 3600, "max_time_s": 86400})
    assert (timed.default_time_s, timed.max_time_s) == (3600.0, 86400.0) and QueueSpec.from_dict(
        timed.to_dict()
    ) == timed
    assert (timed.time_limit(None), timed.time_limit(60), QueueSpec("u", 1, max_time_s=7200).time_limit(None)) == (
        3600.0,
        60,
        7200.0,
    )
    with pytest.raises(InvalidInput, match="--time 2d is above queue t's max time 1d"):
        timed.time_limit(2 * 86400)
    with pytest.raises(InvalidInput, match="default time 2h is above its max time 1h"):
        QueueSpec("v", 1, default_time_s=7200, max_time_s=3600)
    with pytest.raises(InvalidInput, match="max time 0 must be between"):
        QueueSpec("w", 1, max_time_s=0)
    status = QueueStatus(spec, 2.0, 0.5, 3, 1)
    assert status.to_dict() == {
        "name": "a",
        "preempt": "",
        "idle_suspend_s": None,
        "default_time_s": None,
        "max_time_s": None,
        "quota": 1.5,
        "weight": 2.0,
        "limit": 3.0,
        "allocated": 2.0,
        "borrowed": 0.5,
        "waiting": 3,
        "preemptions": 1,
        "preempted": {"suspend": 0, "requeue": 0, "kill": 0},
        "preempt_in_force": "",
    }
    assert QueueStatus.from_dict(status.to_dict()) == status
    row = UsageRow("", 7200.0, 2)
    assert row.to_dict() == {"key": "-", "gpu_seconds": 7200.0, "gpu_hours": 2.0, "leases": 2}
    assert UsageRow.from_dict(row.to_dict()) == row
    pool = PoolStatus(tuple(GPUS), (), queues=(status,))
    assert PoolStatus.from_dict(pool.to_dict()).queues == (status,)


def test_claim_and_lease_carry_queue_fields_compatibly():
    plain = Claim.single(1, fraction=0.5)
    assert set(plain.to_dict()) == {"requests", "policy"}  # older servers read it as before
    queued = Claim.single(1, fraction=0.5, queue="a", priority=-3, preempt_grace_s=10)
    assert Claim.from_dict(queued.to_dict()) == queued
    for bad in ({"priority": 1.5}, {"priority": 10**7}, {"priority": True}):
        with pytest.raises(InvalidClaim, match="priority"):
            Claim.from_dict(dict(plain.to_dict(), **bad))
    for grace in (math.nan, -1, 1e9, "5"):
        with pytest.raises(InvalidClaim, match="preempt_grace_s"):
            Claim.from_dict(dict(plain.to_dict(), preempt_grace_s=grace))
    held = lease("x", "a", priority=2)
    held = Lease(**{**held.__dict__, "preempted_at": 5.0})
    assert Lease.from_dict(held.to_dict()) == held
    old = {k: v for k, v in held.to_dict().items() if k not in ("queue", "priority", "preempt_grace_s", "preempted_at")}
    assert Lease.from_dict(old).queue == "" and Lease.from_dict(old).preempted_at is None


def test_quotas_may_not_sum_above_the_pool():
    check_quotas_fit([QueueSpec("a", 1.5), QueueSpec("b", 0.5)], 2)
    with pytest.raises(InvalidInput, match="sum to 2.5 GPUs"):
        check_quotas_fit([QueueSpec("a", 2), QueueSpec("b", 0.5)], 2)


def test_claim_gpus_counts_fractions_and_memory_on_the_largest_device():
    devices = [Device("s", 0, "small", 1000), Device("l", 1, "large", 4000)]
    assert claim_gpus(Claim.single(2, fraction=0.25), devices) == 0.5
    assert claim_gpus(Claim.single(1, memory_mib=1000), devices) == 0.25


# --- borrowing and admission ------------------------------------------------------------
def test_the_leases_beyond_quota_borrow_by_priority_then_age():
    held = [lease("old", "a", created=1), lease("young", "a", created=2), lease("vip", "a", created=3, priority=9)]
    sizes = {x.id: 1.0 for x in held}
    assert borrowed_ids(held, 2.0, sizes) == {"young"}
    assert borrowed_ids(held, 0.5, sizes) == {"old", "young", "vip"}
    assert borrowers(held + [lease("free", "")], {"a": 3.0}, dict(sizes, free=0.1)) == {"free"}


def test_within_quota_goes_first_then_least_per_weight_and_limits_pass_over():
    loads = {"a": QueueLoad(1, 1, None, 0.0), "b": QueueLoad(0, 2, None, 1.0), "c": QueueLoad(0, 1, None, 0.6)}
    waiting = [Waiting(1, "c", 0, 1.0), Waiting(2, "b", 0, 1.0), Waiting(3, "a", 0, 1.0)]
    assert next_ticket(waiting, loads) == waiting[2]  # a fits its quota
    assert next_ticket(waiting[:2], loads) == waiting[1]  # b holds 1/2 per weight, c 0.6
    limited = dict(loads, b=QueueLoad(0, 2, 1.5, 1.0))
    assert next_ticket(waiting[:2], limited) == waiting[0]
    assert next_ticket([Waiting(5, "b", 0, 1.0)], limited) is None
    inside = [Waiting(1, "a", 0, 0.1), Waiting(2, "a", 5, 0.1), Waiting(3, "a", 5, 0.1)]
    assert [w.ticket for w in admission_order(inside, loads)] == [2, 3, 1]


waitings = st.lists(
    st.tuples(st.sampled_from(["", "a", "b", "c"]), st.integers(-2, 2), st.sampled_from([0.25, 0.5, 1.0])),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(waitings, st.floats(0, 2), st.floats(0.1, 4), st.one_of(st.none(), st.floats(2, 4)))
def test_admission_order_is_a_permutation_in_queue_order(items, quota_a, weight_b, limit_c):
    waiting = [Waiting(i + 1, q, p, g) for i, (q, p, g) in enumerate(items)]
    loads = {
        "a": QueueLoad(quota_a, 1, None, 0.0),
        "b": QueueLoad(0, weight_b, None, 0.5),
        "c": QueueLoad(1, 1, limit_c, 0.0),
    }
    order = admission_order(waiting, loads)
    assert sorted(w.ticket for w in order) == [w.ticket for w in waiting]
    for queue in ("", "a", "b", "c"):
        mine = [(-w.priority, w.ticket) for w in order if w.queue == queue]
        assert mine == sorted(mine)  # inside a queue: priority desc, then first come
    if order:
        assert next_ticket(waiting, loads) in (order[0], None)


# --- victims --------------------------------------------------------------------------------
def test_victims_are_borrowers_of_other_queues_lowest_priority_youngest_and_no_more_than_needed():
    held = [
        lease("a-own", "a", "G0", created=1),
        lease("a-vip", "a", "G1", created=2, priority=5),
        lease("a-young", "a", "G2", created=3),
        lease("b-own", "b", "G3", created=1),
    ]
    sizes = {x.id: 1.0 for x in held}
    borrowing = borrowers(held, {"a": 1, "b": 1}, sizes)
    assert borrowing == {"a-own", "a-young"}  # the high-priority one counts first against a's quota
    claim = Claim.single(1, fraction=1.0, queue="b")
    allocated = allocated_by_device(held)
    found = choose_victims(lambda alloc: place(GPUS, alloc, claim), allocated, held, "b", borrowing)
    assert found is not None
    victims, placement = found
    assert [v.id for v in victims] == ["a-young"] and placement.slices == (Slice("G2", 1000),)
    two = Claim.single(2, fraction=1.0, queue="b")
    victims2, _ = choose_victims(lambda alloc: place(GPUS, alloc, two), allocated, held, "b", borrowing) or ([], None)
    assert {v.id for v in victims2} == {"a-young", "a-own"}  # never a-vip (within quota) nor b's own
    three = Claim.single(3, fraction=1.0, queue="b")
    assert choose_victims(lambda alloc: place(GPUS, alloc, three), allocated, held, "b", borrowing) is None


def test_leases_already_preempted_count_as_gone():
    held = [Lease(**{**lease("x", "a").__dict__, "preempted_at": 1.0}), lease("y", "a", "G1")]
    claim = Claim.single(1, fraction=1.0, queue="b")
    found = choose_victims(
        lambda alloc: place(GPUS[:2], alloc, claim), allocated_by_device(held), held, "b", {"x", "y"}
    )
    assert found is not None and found[0] == []


# --- usage ---------------------------------------------------------------------------------
def test_usage_clips_spans_to_the_window():
    spans = [
        UsageSpan("a", "alice", "", 1.0, 0.0, 100.0),
        UsageSpan("a", "alice", "", 0.5, 50.0, None),
        UsageSpan("b", "bob", "x", 2.0, 300.0, 400.0),
    ]
    rows = usage_rows(spans, 10.0, 200.0, "queue")
    assert rows == [UsageRow("a", 90.0 + 75.0, 2)]
    by_holder = usage_rows(spans, 0, 1000, "holder")
    assert [(r.key, r.gpu_seconds) for r in by_holder] == [("alice", 100.0 + 475.0), ("bob", 200.0)]
    with pytest.raises(InvalidInput):
        usage_rows(spans, 0, 1, "team")


held_leases = st.lists(
    st.tuples(
        st.sampled_from(["", "a", "b"]), st.integers(0, 3), st.sampled_from([250, 500, 1000]), st.integers(-1, 1)
    ),
    max_size=10,
)


@settings(max_examples=200, deadline=None)
@given(held_leases, st.sampled_from([0.25, 0.5, 1.0]), st.integers(1, 2), st.floats(0, 2), st.floats(0, 2))
def test_victims_only_ever_borrow_and_make_room(items, fraction, count, quota_a, quota_b):
    free = {d.uuid: d.memory_mib for d in GPUS}
    held = []
    for i, (queue, gpu, mib, priority) in enumerate(items):
        uuid = f"G{gpu}"
        if free[uuid] >= mib:  # only states the pool could be in
            free[uuid] -= mib
            held.append(lease(f"l{i}", queue, uuid, mib, created=float(i), priority=priority))
    quotas = {"a": quota_a, "b": quota_b}
    sizes = {x.id: x.slices[0].memory_mib / 1000 for x in held}
    borrowing = borrowers(held, quotas, sizes)
    claim = Claim.single(count, fraction=fraction, queue="b")
    allocated = allocated_by_device(held)
    found = choose_victims(lambda alloc: place(GPUS, alloc, claim), allocated, held, "b", borrowing)
    if found is None:
        return
    victims, placement = found
    assert all(v.id in borrowing and v.queue != "b" for v in victims)
    left = allocated_by_device([x for x in held if x not in victims])
    assert place(GPUS, left, claim).fits and placement.fits
