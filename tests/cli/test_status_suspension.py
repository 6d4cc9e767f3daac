"""`gpupool status` shows each lease's state, what a suspended one parked and its last error."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from envs import embedded_env
from gpupool_cli import gpupool

from gpupool.core.model import RUNNING, SUSPENDED, Claim, Holder
from gpupool.pooling.devices import discover
from gpupool.pooling.pool import Pool

DEVICES = "emulated:2x16GiB"


def status(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return gpupool("status", *args, env=embedded_env(tmp_path, DEVICES), check=True)


def test_status_shows_a_suspended_lease_its_parked_bytes_and_a_failed_restore(tmp_path):
    pool = Pool(tmp_path / "state", devices=discover(DEVICES))
    try:
        kept = pool.claim(Claim.single(1, fraction=0.5), Holder("bob"), ttl_s=600)
        parked = pool.claim(Claim.single(1, fraction=0.25), Holder("alice"), ttl_s=600)
        pool.suspend(parked.id, "alice")
        pool.report_parked(parked.id, "alice", host_bytes=3 * 2**30)
        pool.resume(parked.id, "alice")
        pool.report_restored(parked.id, "alice", error="CUDA_ERROR_OUT_OF_MEMORY\nat restore")
    finally:
        pool.close()

    data = json.loads(status(tmp_path, "--json").stdout)
    by_id = {lease["id"]: lease for lease in data["leases"]}
    assert by_id[kept.id]["state"] == RUNNING and by_id[kept.id]["suspension"] is None
    assert by_id[parked.id]["state"] == SUSPENDED
    suspension = by_id[parked.id]["suspension"]
    assert suspension["host_bytes"] == 3 * 2**30 and suspension["parked"][0]["memory_mib"] == 4096
    assert suspension["error"] == "CUDA_ERROR_OUT_OF_MEMORY at restore"

    lines = status(tmp_path).stdout.splitlines()
    header = next(line for line in lines if line.startswith("LEASE"))
    assert header.split()[:8] == ["LEASE", "HOLDER", "LABEL", "STATE", "GPUS", "USED", "PARKED", "EXPIRES"]
    row = next(line for line in lines if line.startswith(parked.id))
    assert f" {SUSPENDED} " in row and "3GiB host (4GiB GPU)" in row
    assert f" {RUNNING} " in next(line for line in lines if line.startswith(kept.id))
    assert f"lease {parked.id} ({SUSPENDED}): CUDA_ERROR_OUT_OF_MEMORY at restore" in lines
