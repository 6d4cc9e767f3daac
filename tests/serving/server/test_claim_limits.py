"""Issue 23 item 8: the size of a claim and the holder's pid are bounded, said once in core and in
the OpenAPI document, and refused with the value and the limit (HTTP 422 JSON, CLI exit 2)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest
from envs import clean_env

from gpupool.core.errors import InvalidClaim
from gpupool.core.model import (
    MAX_GPUS_PER_REQUEST,
    MAX_REQUESTS_PER_CLAIM,
    PID_MAX,
    Claim,
    GpuRequest,
    Holder,
)
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool

TINY = {"count": 1, "memory_mib": 1}


def claim(requests, holder=None) -> dict:
    body: dict = {"claim": {"requests": requests}, "ttl_s": 60}
    if holder is not None:
        body["holder"] = holder
    return body


def test_the_openapi_document_states_the_limits(running_server):
    schemas = httpx.get(running_server.url + "/openapi.json").json()["components"]["schemas"]
    assert schemas["ClaimBody"]["properties"]["requests"]["maxItems"] == MAX_REQUESTS_PER_CLAIM
    assert schemas["GpuRequestBody"]["properties"]["count"]["maximum"] == MAX_GPUS_PER_REQUEST
    for body in ("HolderRequest", "HolderBody"):
        pid = schemas[body]["properties"]["pid"]
        assert (pid["minimum"], pid["maximum"]) == (0, PID_MAX), body


def test_the_limits_are_enforced_by_a_real_server(running_server):
    s = running_server
    post = lambda body: httpx.post(s.url + "/v1/leases", json=body, headers=s.headers(), timeout=30)  # noqa: E731
    started = time.monotonic()
    r = post(claim([TINY] * 30_000))
    refused_s = time.monotonic() - started
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert "30000" in message and str(MAX_REQUESTS_PER_CLAIM) in message
    print(f"a claim of 30,000 requests refused in {refused_s * 1000:.0f} ms (the request's whole round trip)")
    r = post(claim([dict(TINY, count=MAX_GPUS_PER_REQUEST + 1)]))
    assert r.status_code == 422 and str(MAX_GPUS_PER_REQUEST) in r.json()["error"]["message"], r.text
    for pid in (2**64, PID_MAX + 1, -1):
        r = post(claim([TINY], {"pid": pid}))
        assert r.status_code == 422, (pid, r.text)
        assert f"holder.pid {pid}" in r.json()["error"]["message"] and str(PID_MAX) in r.json()["error"]["message"]
    # at the limits: granted
    started = time.monotonic()
    r = post(claim([TINY] * MAX_REQUESTS_PER_CLAIM, {"pid": PID_MAX}))
    assert r.status_code == 201, r.text
    print(f"a claim of {MAX_REQUESTS_PER_CLAIM} requests granted in {(time.monotonic() - started) * 1000:.0f} ms")
    lease = r.json()
    assert len(lease["devices"]) == MAX_REQUESTS_PER_CLAIM and lease["holder"]["pid"] == PID_MAX


def test_the_cli_refuses_too_many_gpus_with_exit_2(tmp_path):
    env = clean_env(GPUPOOL_DEVICES="emulated:2x16GiB", HOME=str(tmp_path))
    n = str(MAX_GPUS_PER_REQUEST + 1)
    args = [sys.executable, "-m", "gpupool", "run", "--state", str(tmp_path / "s"), "-n", n, "-m", "1", "--", "true"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("gpupool: error: ") and n in line and str(MAX_GPUS_PER_REQUEST) in line


def test_core_checks_the_claim_size_and_the_pid():
    with pytest.raises(InvalidClaim, match=f"limit of {MAX_REQUESTS_PER_CLAIM}"):
        Claim((GpuRequest(1, memory_mib=1),) * (MAX_REQUESTS_PER_CLAIM + 1))
    with pytest.raises(InvalidClaim, match=f"limit of {MAX_REQUESTS_PER_CLAIM}"):
        Claim.from_dict({"requests": [TINY] * (MAX_REQUESTS_PER_CLAIM + 1)})
    assert len(Claim.from_dict({"requests": [TINY] * MAX_REQUESTS_PER_CLAIM}).requests) == MAX_REQUESTS_PER_CLAIM
    with pytest.raises(InvalidClaim, match="GPUs per request"):
        GpuRequest(MAX_GPUS_PER_REQUEST + 1, memory_mib=1)
    for pid in (2**64, -1, PID_MAX + 1):
        with pytest.raises(InvalidClaim, match="holder.pid"):
            Holder.from_dict({"pid": pid})
    assert Holder.from_dict({"pid": PID_MAX}).pid == PID_MAX and Holder.from_dict({}).pid == 0


def test_a_lease_stored_before_the_pid_check_still_reads(tmp_path):
    """A row written by an older server (pid 2^64) must not make the pool unreadable: it reads as no pid."""
    pool = Pool(tmp_path, devices=emulated_devices("1x8GiB", "n"), node="n")
    try:
        lease = pool.claim(Claim.single(1, memory_mib=1), Holder("bob", 1, "h"), ttl_s=600)
    finally:
        pool.close()
    with sqlite3.connect(tmp_path / "pool.db") as conn:
        conn.execute("UPDATE leases SET holder = ?", (json.dumps({"name": "bob", "pid": 2**64, "host": "h"}),))
    pool = Pool(tmp_path, node="n")
    try:
        (read,) = pool.status().leases
        assert read.id == lease.id and read.holder.pid == 0
    finally:
        pool.close()
