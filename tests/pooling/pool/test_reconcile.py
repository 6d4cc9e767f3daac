"""Issue 9: devices reconciled at start: leases on GPUs that shrank or went are reported, never over-granted."""

from __future__ import annotations

import logging

import pytest

from gpupool.core.errors import Unavailable
from gpupool.core.invariants import lease_problems
from gpupool.core.model import Claim, Holder
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool


def test_a_restart_with_smaller_gpus_is_reported_and_their_memory_stays_held(tmp_path, caplog):
    pool = Pool(tmp_path, devices=emulated_devices("2x16GiB", "n"))
    lease = pool.claim(Claim.single(2, fraction=1.0), Holder("alice"), ttl_s=600)
    pool.close()
    with caplog.at_level(logging.WARNING):
        pool = Pool(tmp_path, devices=emulated_devices("2x8GiB", "n"))
    try:
        status = pool.status()
        problems = status.problems()
        assert len(problems) == 2 and all("16384 MiB" in p and lease.id in p for p in problems)
        assert status.to_dict()["problems"] == problems
        assert problems[0] in caplog.text
        with pytest.raises(Unavailable):  # the memory the live lease holds is never granted again
            pool.claim(Claim.single(1, fraction=0.1), Holder("bob"))
        pool.release(lease.id)
        assert pool.status().problems() == []
        pool.claim(Claim.single(2, fraction=1.0), Holder("bob"))
    finally:
        pool.close()


def test_a_lease_on_a_gpu_that_is_gone_is_reported(tmp_path):
    pool = Pool(tmp_path, devices=emulated_devices("2x16GiB", "n"))
    lease = pool.claim(Claim.single(2, fraction=0.5), Holder("alice"), ttl_s=600)
    pool.close()
    pool = Pool(tmp_path, devices=emulated_devices("1x16GiB", "n"))
    try:
        (problem,) = pool.status().problems()
        assert "no longer has" in problem and f"gpupool release {lease.id}" in problem
        devices = pool.devices()
        kinds = [p.kind for p in lease_problems(devices, pool.status().leases)]
        assert kinds == ["lease_on_unknown_device"]
    finally:
        pool.close()
