"""Property tests of core.placement: capacity, all-or-nothing, policies, filters."""

from __future__ import annotations

from typing import Dict, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.filters import Filter
from gpupool.core.model import Claim, Device, GpuRequest, Policy
from gpupool.core.placement import could_ever_fit, place

MEMS = [1024, 8192, 16384, 40960, 81920]


@st.composite
def pools(draw, max_devices: int = 8):
    n = draw(st.integers(0, max_devices))
    devices = [
        Device(
            uuid=f"GPU-{i}",
            index=i,
            name=draw(st.sampled_from(["A100", "T4", "H100"])),
            memory_mib=draw(st.sampled_from(MEMS)),
            node="n",
            healthy=draw(st.booleans().map(lambda b: b or draw(st.integers(0, 9)) > 0)),
        )
        for i in range(n)
    ]
    allocated = {d.uuid: draw(st.integers(0, d.memory_mib)) for d in devices}
    return devices, allocated


@st.composite
def requests(draw):
    count = draw(st.integers(1, 4))
    filters = draw(
        st.lists(
            st.sampled_from(["device.name=A100", "device.name=*1*", "device.memory>=16GiB", "device.index<=3"]),
            max_size=1,
        )
    )
    parsed = tuple(Filter.parse(f) for f in filters)
    if draw(st.booleans()):
        return GpuRequest(count, fraction=draw(st.sampled_from([0.1, 0.25, 0.3, 0.5, 0.75, 1.0])), filters=parsed)
    return GpuRequest(count, memory_mib=draw(st.sampled_from([512, 1024, 4096, 8192, 20000])), filters=parsed)


@st.composite
def claims(draw, max_requests: int = 3):
    reqs = tuple(draw(st.lists(requests(), min_size=1, max_size=max_requests)))
    return Claim(reqs, draw(st.sampled_from(list(Policy))))


def _check_valid(devices: List[Device], allocated: Dict[str, int], claim: Claim, slices) -> None:
    by_uuid = {d.uuid: d for d in devices}
    used = dict(allocated)
    for s in slices:
        used[s.device_uuid] = used.get(s.device_uuid, 0) + s.memory_mib
    for uuid, mib in used.items():
        assert mib <= by_uuid[uuid].memory_mib, f"{uuid} over capacity"
    for group, request in enumerate(claim.requests):
        mine = [s for s in slices if s.group == group]
        assert len(mine) == request.count, "all or nothing: every request gets its count"
        assert len({s.device_uuid for s in mine}) == request.count, "a request's GPUs are distinct"
        for s in mine:
            device = by_uuid[s.device_uuid]
            assert device.healthy
            assert request.accepts(device)
            assert s.memory_mib == request.memory_on(device)
    assert len(slices) == sum(r.count for r in claim.requests)


@settings(max_examples=300, deadline=None)
@given(pools(), claims())
def test_never_over_capacity_and_all_or_nothing(pool, claim):
    devices, allocated = pool
    placement = place(devices, allocated, claim)
    if placement.fits:
        _check_valid(devices, allocated, claim, placement.slices)
        assert placement.reason == ""
    else:
        assert placement.slices is None
        assert placement.reason


@settings(max_examples=300, deadline=None)
@given(pools(), requests(), st.sampled_from(list(Policy)))
def test_single_request_is_exact(pool, request, policy):
    """For one request greedy is exact: it fits iff enough matching devices have room."""
    devices, allocated = pool
    claim = Claim((request,), policy)
    room = [
        d
        for d in devices
        if d.healthy and request.accepts(d) and d.memory_mib - allocated[d.uuid] >= request.memory_on(d)
    ]
    assert place(devices, allocated, claim).fits == (len(room) >= request.count)


@settings(max_examples=200, deadline=None)
@given(pools(), requests(), st.sampled_from(list(Policy)))
def test_fits_now_implies_could_ever_fit(pool, request, policy):
    devices, allocated = pool
    claim = Claim((request,), policy)
    if place(devices, allocated, claim).fits:
        assert could_ever_fit(devices, claim).fits


@settings(max_examples=200, deadline=None)
@given(pools(), st.integers(1, 20000))
def test_binpack_takes_the_fullest_fitting_gpu(pool, mib):
    devices, allocated = pool
    placement = place(devices, allocated, Claim.single(1, memory_mib=mib, policy=Policy.BINPACK))
    if placement.fits:
        chosen = placement.slices[0].device_uuid
        left = {d.uuid: d.memory_mib - allocated[d.uuid] - mib for d in devices if d.healthy}
        assert left[chosen] == min(v for v in left.values() if v >= 0)


@settings(max_examples=200, deadline=None)
@given(pools(), st.integers(1, 20000))
def test_spread_takes_the_emptiest_gpu(pool, mib):
    devices, allocated = pool
    placement = place(devices, allocated, Claim.single(1, memory_mib=mib, policy=Policy.SPREAD))
    if placement.fits:
        chosen = placement.slices[0].device_uuid
        share = {
            d.uuid: (d.memory_mib - allocated[d.uuid]) / d.memory_mib
            for d in devices
            if d.healthy and d.memory_mib - allocated[d.uuid] >= mib
        }
        assert share[chosen] == max(share.values())


def test_binpack_keeps_whole_gpus_free():
    devices = [Device(f"G{i}", i, "T4", 16384) for i in range(2)]
    claim = Claim.single(1, fraction=0.25)
    allocated: Dict[str, int] = {}
    for _ in range(4):
        s = place(devices, allocated, claim).slices[0]
        allocated[s.device_uuid] = allocated.get(s.device_uuid, 0) + s.memory_mib
    assert allocated == {"G0": 16384}
    assert place(devices, allocated, Claim.single(1, fraction=1.0)).fits


def test_spread_uses_every_gpu():
    devices = [Device(f"G{i}", i, "T4", 16384) for i in range(4)]
    claim = Claim.single(1, fraction=0.25, policy=Policy.SPREAD)
    allocated: Dict[str, int] = {}
    for _ in range(4):
        s = place(devices, allocated, claim).slices[0]
        allocated[s.device_uuid] = allocated.get(s.device_uuid, 0) + s.memory_mib
    assert sorted(allocated) == ["G0", "G1", "G2", "G3"]


def test_gang_is_all_or_nothing_and_retries_biggest_first():
    devices = [Device("G0", 0, "A100", 40960), Device("G1", 1, "A100", 20480)]
    # Spread puts the small request first on G0, stranding the big one; the retry places the big one first.
    claim = Claim((GpuRequest(1, memory_mib=20480), GpuRequest(1, memory_mib=40960)), Policy.SPREAD)
    placement = place(devices, {}, claim)
    assert placement.fits
    assert {(s.device_uuid, s.group) for s in placement.slices} == {("G1", 0), ("G0", 1)}
    assert not place(devices, {"G1": 1}, claim).fits


def test_filters_and_unhealthy_devices():
    devices = [Device("G0", 0, "Tesla T4", 16384), Device("G1", 1, "A100-SXM4", 40960, healthy=False)]
    assert not place(devices, {}, Claim.single(1, fraction=0.5, filters=[Filter.parse("device.name=*a100*")])).fits
    ok = place(devices, {}, Claim.single(1, fraction=0.5, filters=[Filter.parse("device.memory>=8GiB")]))
    assert ok.slices[0].device_uuid == "G0"
    reason = place(devices, {}, Claim.single(2, fraction=0.5)).reason
    assert "1 healthy" in reason


def test_empty_pool_reason():
    placement = could_ever_fit([], Claim.single(1, fraction=0.5))
    assert not placement.fits and "no GPUs" in placement.reason


@pytest.mark.parametrize(
    "text",
    ["gpu.name=x", "device.name>=3", "device.index=abc", "nonsense"],
)
def test_bad_filters_are_rejected(text):
    from gpupool.core.errors import InvalidClaim

    with pytest.raises(InvalidClaim):
        Filter.parse(text)
