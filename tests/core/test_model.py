"""Round trips of the wire format and validation of claims."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.core.errors import (
    Forbidden,
    GpupoolError,
    InvalidClaim,
    InvalidInput,
    LeaseLost,
    NotFound,
    ServerUnreachable,
    Unauthorized,
    Unavailable,
    error_for_status,
    error_from_dict,
)
from gpupool.core.model import Claim, Device, GpuRequest, Holder, Lease, Slice
from gpupool.core.quantity import format_mib, parse_fraction, parse_memory_mib
from gpupool.core.status import PoolStatus


@given(st.integers(1, 8), st.floats(0.01, 1.0), st.text(max_size=5))
def test_claim_round_trip(count, fraction, name):
    claim = Claim.single(count, fraction=fraction)
    assert Claim.from_dict(claim.to_dict()) == claim
    holder = Holder(name, 12, "h", "l")
    lease = Lease("id", holder, (Slice("G", 10, 0),), 30.0, 1.0, 31.0)
    assert Lease.from_dict(lease.to_dict()) == lease


@pytest.mark.parametrize(
    "data",
    [
        {"requests": []},
        {"requests": [{"count": 0, "fraction": 0.5}]},
        {"requests": [{"count": 1, "fraction": 1.5}]},
        {"requests": [{"count": 1, "fraction": "x"}]},
        {"requests": [{"count": 1}]},
        {"requests": [{"count": 1, "fraction": 0.5, "memory_mib": 4}]},
        {"requests": [{"count": 1, "fraction": 0.5, "filters": ["bad.key=1"]}]},
        {"requests": [{"count": "2", "fraction": 0.5}]},
        {"requests": [{"count": 1, "fraction": 0.5}], "policy": "random"},
        "not a claim",
    ],
)
def test_bad_claims(data):
    with pytest.raises(InvalidClaim):
        Claim.from_dict(data)


def test_quantities():
    assert parse_memory_mib("16GiB") == 16384
    assert parse_memory_mib("512") == 512
    assert parse_fraction("50%") == 0.5
    assert format_mib(1536) == "1.5GiB"
    with pytest.raises(InvalidInput):
        parse_memory_mib("lots")
    with pytest.raises(InvalidInput):
        parse_fraction("2")


def test_error_round_trip():
    err = error_from_dict(Unavailable("full").to_dict())
    assert isinstance(err, Unavailable) and err.message == "full"
    assert type(error_from_dict({"x": 1})).__name__ == "GpupoolError"


def test_error_for_status_reads_the_classes_own_statuses():
    # the HTTP client's reading of a bare status comes from the classes, not a second table
    for cls in (
        InvalidInput,
        InvalidClaim,
        Unavailable,
        NotFound,
        Unauthorized,
        Forbidden,
        ServerUnreachable,
        LeaseLost,
    ):
        err = error_for_status(cls.http_status, "m")
        assert type(err) is cls and err.message == "m"
    assert type(error_for_status(409, "m")) is Unavailable  # not StateLocked, a local-only error
    assert type(error_for_status(418, "m")) is GpupoolError


def test_status_shape():
    status = PoolStatus((), (), 2, "n")
    assert PoolStatus.from_dict(status.to_dict()) == status
    assert GpuRequest(1, fraction=0.5).describe().startswith("1 GPU")


@pytest.mark.parametrize("memory_mib", [81559, 16384, 16383, 24564, 97])
@pytest.mark.parametrize("k", [2, 3, 4, 7, 8])
def test_k_shares_of_one_kth_fit_one_gpu_whatever_its_size(memory_mib, k):
    # NVML reports an H100 as 81,559 MiB: two halves rounded up would not fit it.
    device = Device(index=0, uuid="GPU-x", name="test", memory_mib=memory_mib)
    share = GpuRequest(1, fraction=1 / k).memory_on(device)
    assert k * share <= memory_mib
    assert share >= memory_mib // k
