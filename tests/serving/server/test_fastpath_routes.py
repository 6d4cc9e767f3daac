"""The fast path serves the hot calls where the operation table puts them, and nothing else."""

from __future__ import annotations

import pytest

from gpupool.core.operations import CLAIM, HEARTBEAT, OPERATIONS, RELEASE
from gpupool.serving.server.fastpath import _route


@pytest.mark.parametrize("op", [CLAIM, HEARTBEAT, RELEASE], ids=lambda op: op.name)
def test_a_hot_call_is_served_at_the_table_s_method_and_path(op):
    path = op.path.format(lease_id="0123456789abcdef")
    assert _route(op.method, path) == (op.name, "0123456789abcdef" if op.path_args() else "")


def test_every_other_verb_of_the_table_goes_to_the_app():
    others = [op for op in OPERATIONS if op not in (CLAIM, HEARTBEAT, RELEASE)]
    for op in others:
        path = op.path.format(**dict.fromkeys(op.path_args(), "x"))
        assert _route(op.method, path) is None, op.name


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/v1/leases//heartbeat"),
        ("DELETE", "/v1/leases/"),
        ("DELETE", "/v1/leases/abc/"),
        ("POST", "//v1/leases"),
        ("POST", "/v1/leasesX"),
        ("PUT", "/v1/leases"),
    ],
)
def test_a_near_miss_goes_to_the_app(method, path):
    assert _route(method, path) is None
