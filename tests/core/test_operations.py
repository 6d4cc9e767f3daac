"""The operation table (core.operations): each entry is callable in-process and over HTTP as declared."""

from __future__ import annotations

import inspect

import pytest

from gpupool.core import operations as ops
from gpupool.core.model import Claim, Holder
from gpupool.pooling.pool import Pool
from gpupool.workload.client.base import PoolClient


@pytest.mark.parametrize("op", [op for op in ops.OPERATIONS if op.pool], ids=lambda op: op.name)
def test_each_pool_method_takes_what_the_entry_gives_it(op):
    """The Pool method an entry names exists and binds its arguments (mypy cannot see a getattr)."""
    owner, *parts = (Pool, *op.pool.split("."))
    if parts[:-1]:  # a part of the pool: its class is the annotation of Pool's attribute
        pytest.skip(f"{op.pool}: a part of the pool, checked by the in-process tests")
    method = getattr(owner, parts[-1])
    inspect.signature(method).bind(None, *op.pool_args)  # None: self


@pytest.mark.parametrize("op", ops.OPERATIONS, ids=lambda op: op.name)
def test_each_entry_is_said_once(op):
    assert op.method in ("GET", "POST", "PUT", "DELETE") and op.path.startswith("/v1/")
    assert op.who in (ops.ANYONE, ops.ADMIN, ops.MINTER)
    assert not op.body or op.request, "body fields without a request model"
    assert sum(other.name == op.name for other in ops.OPERATIONS) == 1
    routes = [(o.method, o.path) for o in ops.OPERATIONS if (o.method, o.path) == (op.method, op.path)]
    assert len(routes) == 1 or op in (ops.GET_LEASE, ops.WATCH)
    assert not (op.pool and op.serve), "the pool or the server answers it, not both"
    assert op.pool or op.serve or not op.route, "a generated route calls the pool or the server's own method"
    assert not op.timed or op.pool, "a timed report is the pool's"


@pytest.mark.parametrize("op", [op for op in ops.OPERATIONS if op.serve], ids=lambda op: op.name)
def test_each_server_method_takes_what_the_entry_gives_it(op):
    """The server's own method an entry names (`serve`: the tokens, the doctor) binds its arguments."""
    from gpupool.serving.server.handlers import LeaseApi

    inspect.signature(getattr(LeaseApi, op.serve)).bind(None, *op.pool_args)  # None: self


def test_pool_client_has_one_abstract_method():
    """Every method of PoolClient is derived from `call`: an HTTP or in-process client writes only it."""
    assert PoolClient.__abstractmethods__ == frozenset({"call"})


def test_the_wire_of_the_default_encoding():
    assert ops.SUSPEND.wire({"lease_id": "l1", "reason": "why"}) == ({}, {"reason": "why"})
    assert ops.HEARTBEAT.wire({"lease_id": "l1"}) == ({}, None)
    assert ops.RESUME.wire({"lease_id": "l1"}) == ({}, {})
    assert ops.WAITING.wire({"queue": None, "key": "k"}) == ({"key": "k"}, None)
    assert ops.RELEASE.wire({"lease_id": "l", "exit_code": None, "timed_out": False}) == ({}, None)
    assert ops.RELEASE.wire({"lease_id": "l", "exit_code": 3, "timed_out": True}) == (
        {},
        {"exit_code": 3, "timed_out": True},
    )
    query, _ = ops.USAGE.wire({"since": 5, "until": None, "by": "queue", "user": "", "queue": "q"})
    assert query == {"since": "5.0", "by": "queue", "queue": "q"}
    assert ops.CLAIM_PRIORITY.path_args() == ("claim_id",)


def test_a_server_verb_on_the_embedded_pool_is_one_line(tmp_path, monkeypatch):
    from gpupool.core.errors import InvalidInput
    from gpupool.workload.client.embedded import EmbeddedPoolClient

    monkeypatch.setenv("GPUPOOL_DEVICES", "emulated:1x16GiB")
    with EmbeddedPoolClient(tmp_path, devices_from_env=True) as client:
        with pytest.raises(InvalidInput, match="GET /v1/doctor is a pool server's: give --server URL"):
            client.call(ops.DOCTOR)
        lease = client.claim(Claim.single(1, 0.5), Holder("me"))
        # pool.status answers in-process, as a server would: the lease list's JSON
        assert client.call(ops.LIST_LEASES) == {"leases": [lease.to_dict()]}
        assert [d["uuid"] for d in client.call(ops.DEVICES)["devices"]] == [lease.slices[0].device_uuid]
