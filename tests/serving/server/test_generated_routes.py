"""The /v1 routes come from the operation table (issue 37), but for the few still written by hand."""

from __future__ import annotations

from fastapi.routing import APIRoute

from gpupool.core import operations as ops
from gpupool.serving.server.operation_routes import operation_routes
from gpupool.serving.server.routes import ROUTERS

# What the table cannot generate without a change of behaviour (docs/architecture/index.md says why):
# the claim (its wait on the event loop, its metrics), the lease's GET with its ?watch= long poll
# (two entries, one route) and the release (its optional body, its count), shared with the fast path.
WRITTEN = {("POST", "/v1/leases"), ("GET", "/v1/leases/{lease_id}"), ("DELETE", "/v1/leases/{lease_id}")}


def _served(routes) -> set:
    return {(method, r.path) for r in routes if isinstance(r, APIRoute) for method in r.methods}


def test_the_written_routes_are_the_few_the_table_cannot_generate():
    written = {route for router in ROUTERS for route in _served(router.routes) if route[1].startswith("/v1/")}
    assert written == WRITTEN
    assert _served(operation_routes.routes) == {(op.method, op.path) for op in ops.OPERATIONS} - WRITTEN


def test_a_generated_route_keeps_the_operation_id_it_had_when_written():
    """Clients generated from the OpenAPI document keep their method names."""
    ids = {r.name for r in operation_routes.routes if isinstance(r, APIRoute)}
    assert {"put_queue", "usage", "history", "parked", "restored", "heartbeat", "doctor"} <= ids
    assert {"tokens", "token_list", "token_revoke", "token_rotate"} <= ids
