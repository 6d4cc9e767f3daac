"""Inside a pod, `gpupool run` sends the claim decided for its container ($GPUPOOL_CLAIM), pinned to
or checked against the GPUs the device plugin allocated ($GPUPOOL_ALLOCATED_GPUS): real runs on an
embedded, emulated pool, and the rules on their own."""

from __future__ import annotations

import json
import sys
from typing import Dict, List

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.model import Claim
from gpupool.pooling.isolation.env import ALLOCATED_GPUS_ENV, CLAIM_ENV
from gpupool.workload.runner.podclaim import decided_claim, follow_allocation, pinned_gpus

PRINT_GPUS = [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]


def claim_json(*requests: Dict[str, object], policy: str = "binpack") -> str:
    return json.dumps({"requests": list(requests), "policy": policy})


def visible(pool, env: Dict[str, str], *args: str) -> tuple:
    done = pool.run("run", *args, "--", *PRINT_GPUS, env=dict(pool.env, **env))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(","), done.stderr


@pytest.fixture
def uuids(pool2) -> List[str]:
    return [d["uuid"] for d in pool2.status()["devices"]]


def test_the_decided_claim_is_sent_as_it_is(pool2, uuids):
    """Pinned to GPU 1, which the pool alone (binpack on empty GPUs) would not take."""
    pinned = claim_json({"count": 1, "fraction": 0.25, "filters": [f"device.uuid={uuids[1]}"]})
    gpus, stderr = visible(pool2, {CLAIM_ENV: pinned})
    assert gpus == [uuids[1]] and "warning" not in stderr
    assert visible(pool2, {}, "-n", "1", "-p", "0.25", "--policy", "binpack")[0] == [uuids[0]]
    # the user's own flags win over the variable: their share, parsed once
    assert visible(pool2, {CLAIM_ENV: pinned}, "-p", "0.25", "--policy", "binpack")[0] == [uuids[0]]


def test_an_unpinned_claim_follows_the_device_plugins_gpus(pool2, uuids):
    ask = claim_json({"count": 2, "memory_mib": 4096})
    allocated = f"{uuids[1]},{uuids[0]}"
    gpus, stderr = visible(pool2, {CLAIM_ENV: ask, ALLOCATED_GPUS_ENV: allocated})
    assert gpus == [uuids[1], uuids[0]] and "warning" not in stderr


def test_a_pinned_claim_the_kubelet_counted_elsewhere_is_claimed_where_decided(pool2, uuids):
    pinned = claim_json({"count": 1, "fraction": 0.5, "filters": [f"device.uuid={uuids[1]}"]})
    gpus, stderr = visible(pool2, {CLAIM_ENV: pinned, ALLOCATED_GPUS_ENV: uuids[0]})
    assert gpus == [uuids[1]]
    assert f"warning: the kubelet counts this container's units on {uuids[0]}" in stderr


@pytest.mark.parametrize(
    "value, says",
    [
        ("", "$GPUPOOL_CLAIM is empty: the pod was not bound by gpupool's scheduler extender"),
        ("{not json", "$GPUPOOL_CLAIM '{not json' is not JSON"),
        ('{"requests": []}', "claim.requests must be a non-empty list"),
        ('{"requests": [{"count": 1, "fraction": 2}]}', "fraction 2.0 is outside (0, 1]"),
    ],
)
def test_a_bad_claim_variable_is_one_line_exit_2(pool, value, says):
    done = pool.run("run", "--", "true", env=dict(pool.env, **{CLAIM_ENV: value}))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert says in line


def test_follow_allocation_rules():
    said: List[str] = []
    one = Claim.from_dict({"requests": [{"count": 2, "fraction": 0.5}, {"count": 1, "memory_mib": 100}]})
    pinned = follow_allocation(one, "GPU-a,GPU-b,GPU-c", said.append)
    assert pinned_gpus(pinned) == ["GPU-a", "GPU-b", "GPU-c"]
    assert [(r.fraction, r.memory_mib) for r in pinned.requests] == [(0.5, None), (0.5, None), (None, 100)]
    assert follow_allocation(one, "", said.append) is one and said == []
    assert follow_allocation(one, "GPU-a", said.append) is one  # 3 asked, 1 allocated: the pool chooses
    assert "allocated units on 1 GPU(s) for a claim of 3" in said[-1]
    # a UUID is pinned as an escaped glob (kube.choice), and compared so
    odd = Claim.from_dict({"requests": [{"count": 1, "fraction": 0.5, "filters": ["device.uuid=GPU-[[]x]"]}]})
    said.clear()
    assert follow_allocation(odd, "GPU-[x]", said.append) is odd and said == []


def test_no_variable_no_decided_claim():
    assert decided_claim({}, print) is None
    with pytest.raises(InvalidInput, match="--no-bind"):
        decided_claim({CLAIM_ENV: " "}, print)
