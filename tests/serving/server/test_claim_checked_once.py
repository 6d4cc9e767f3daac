"""An HTTP claim's rules are checked once: by its request model (server/models.py), whose rules are
core's; the core types are then built without running their checks again (core.model.prechecked)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpupool.core.model import (
    MAX_GPUS_PER_REQUEST,
    MAX_IDLE_SUSPEND_S,
    MAX_PREEMPT_GRACE_S,
    MAX_PRIORITY,
    MAX_REQUESTS_PER_CLAIM,
    MIN_FRACTION,
    MIN_IDLE_SUSPEND_S,
    Claim,
    GpuRequest,
)
from gpupool.serving.server.auth import ANONYMOUS
from gpupool.serving.server.handlers import parse_claim
from gpupool.serving.server.models import ClaimRequest

# Bodies on every edge the rules allow: each must pass the model, and core's own checks too.
EDGES = [
    {"requests": [{"count": MAX_GPUS_PER_REQUEST, "fraction": MIN_FRACTION}]},
    {"requests": [{"count": 1, "fraction": 1}], "policy": "binpack", "queue": "a"},
    {"requests": [{"memory_mib": 1}] * MAX_REQUESTS_PER_CLAIM, "priority": -MAX_PRIORITY},
    {"requests": [{"memory_mib": 8192, "filters": ["device.index>=1"]}], "priority": MAX_PRIORITY},
    {"requests": [{"fraction": 0.5}], "preempt_grace_s": 0, "idle_suspend_s": MIN_IDLE_SUSPEND_S},
    {"requests": [{"fraction": 0.5}], "preempt_grace_s": MAX_PREEMPT_GRACE_S, "idle_suspend_s": MAX_IDLE_SUSPEND_S},
]


@pytest.mark.parametrize("body", EDGES)
def test_what_the_model_accepts_core_accepts_and_builds_the_same(body):
    claim = ClaimRequest.model_validate({"claim": body}).claim.to_core()
    checked = Claim(
        tuple(GpuRequest(**dataclasses.asdict(r) | {"filters": r.filters}) for r in claim.requests),
        claim.policy,
        claim.queue,
        claim.priority,
        claim.preempt_grace_s,
        claim.idle_suspend_s,
    )
    assert claim == checked


def test_a_claim_request_runs_no_core_check(monkeypatch):
    calls = []
    for cls in (Claim, GpuRequest):
        checks = cls.__post_init__
        monkeypatch.setattr(cls, "__post_init__", lambda self, checks=checks: calls.append(self) or checks(self))
    raw = json.dumps({"claim": EDGES[0], "holder": {"pid": 1}}).encode()
    claim, _holder, _wait, _ttl, _key = parse_claim(raw, ANONYMOUS, False, 30.0)
    assert claim.requests[0].count == MAX_GPUS_PER_REQUEST
    assert calls == []  # the model checked it; core's checks ran not a second time
    Claim.single(1, 0.5)  # and they run for every claim made in-process
    assert len(calls) == 2
