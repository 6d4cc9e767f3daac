"""Issue 24: the OpenAPI document's rules are the server's. For each rule of a request body (the
fraction/memory exclusivity, every limit, every pattern, every kind), a body the document's schema
refuses is refused by a real server (4xx, one line naming the field), and a body it accepts passes
the server's validation; on both roads of a claim (the fast path and FastAPI's routes)."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import httpx
import jsonschema
import pytest

from gpupool.core.model import (
    MAX_GPUS_PER_REQUEST,
    MAX_PREEMPT_GRACE_S,
    MAX_PRIORITY,
    MAX_REQUESTS_PER_CLAIM,
    MAX_TTL_S,
    MAX_WAIT_S,
    MIN_FRACTION,
    MIN_TTL_S,
    PID_MAX,
    Device,
    GpuRequest,
)
from gpupool.core.outage import MAX_KEY_LEN, MIN_KEY_LEN
from gpupool.core.queues import MAX_QUEUE_GPUS, MAX_WEIGHT

HALF = {"count": 1, "fraction": 0.5}
# Codes of a claim that passed validation and was then refused by the pool (no room, never fits).
POOL_CODES = ("unavailable", "unsatisfiable")


def claim(request: Optional[Dict[str, Any]] = None, **fields: Any) -> Dict[str, Any]:
    """A claim request body: one GPU request (`HALF` unless given), claim fields, top-level fields."""
    top = {k: fields.pop(k) for k in ("holder", "wait_s", "ttl_s", "key", "colour") if k in fields}
    return {"claim": {"requests": [HALF if request is None else request], **fields}, **top}


def with_request(**fields: Any) -> Dict[str, Any]:
    return claim({k: v for k, v in {**HALF, **fields}.items() if v is not ...})


# (case, body, whether the document accepts it, the field a refusal names)
CLAIMS: List[Tuple[str, Dict[str, Any], bool, str]] = [
    ("fraction", with_request(), True, ""),
    ("memory", with_request(fraction=..., memory_mib=1024), True, ""),
    ("fraction, memory null", with_request(memory_mib=None), True, ""),
    ("fraction and memory", with_request(memory_mib=1024), False, "fraction"),
    ("neither", with_request(fraction=...), False, "fraction"),
    ("fraction null, no memory", with_request(fraction=None), False, "memory_mib"),
    ("fraction at its minimum", with_request(fraction=MIN_FRACTION), True, ""),
    ("fraction below it", with_request(fraction=MIN_FRACTION / 2), False, "fraction"),
    ("fraction 1", with_request(fraction=1), True, ""),
    ("fraction over 1", with_request(fraction=1.000001), False, "fraction"),
    ("fraction a string", with_request(fraction="0.5"), False, "fraction"),
    ("fraction true", with_request(fraction=True), False, "fraction"),
    ("memory 0", with_request(fraction=..., memory_mib=0), False, "memory_mib"),
    ("memory 1.5", with_request(fraction=..., memory_mib=1.5), False, "memory_mib"),
    ("count 0", with_request(count=0), False, "count"),
    ("count at the limit", with_request(count=MAX_GPUS_PER_REQUEST), True, ""),
    ("count over it", with_request(count=MAX_GPUS_PER_REQUEST + 1), False, "count"),
    ("count a string", with_request(count="1"), False, "count"),
    ("count absent", with_request(count=...), True, ""),
    ("filters", with_request(filters=["device.name=*16GiB*", "device.memory>=8GiB", "device.index<=1"]), True, ""),
    ("a filter with a space", with_request(filters=["device.name=Emulated GPU*"]), True, ""),
    ("filters null", with_request(filters=None), True, ""),
    ("an unknown filter key", with_request(filters=["gpu.kind=x"]), False, "filters"),
    ("a name filter by >=", with_request(filters=["device.name>=a"]), False, "filters"),
    ("an index filter not a number", with_request(filters=["device.index=first"]), False, "filters"),
    ("filters a string", with_request(filters="device.index=0"), False, "filters"),
    ("no requests", {"claim": {"requests": []}}, False, "requests"),
    ("requests at the limit", {"claim": {"requests": [{"memory_mib": 1}] * MAX_REQUESTS_PER_CLAIM}}, True, ""),
    (
        "requests over it",
        {"claim": {"requests": [{"memory_mib": 1}] * (MAX_REQUESTS_PER_CLAIM + 1)}},
        False,
        "requests",
    ),
    ("a request not an object", {"claim": {"requests": [1]}}, False, "requests"),
    ("policy", claim(policy="spread"), True, ""),
    ("policy in capitals", claim(policy="BINPACK"), False, "policy"),
    ("policy null", claim(policy=None), False, "policy"),
    ("queue", claim(queue="team-a"), True, ""),
    ("queue empty", claim(queue=""), True, ""),
    ("queue not a DNS label", claim(queue="Team-A"), False, "queue"),
    ("queue a number", claim(queue=5), False, "queue"),
    ("priority at the limit", claim(priority=MAX_PRIORITY), True, ""),
    ("priority under the low limit", claim(priority=-MAX_PRIORITY - 1), False, "priority"),
    ("priority 1.5", claim(priority=1.5), False, "priority"),
    ("grace at the limit", claim(preempt_grace_s=MAX_PREEMPT_GRACE_S), True, ""),
    ("grace over it", claim(preempt_grace_s=MAX_PREEMPT_GRACE_S + 1), False, "preempt_grace_s"),
    ("grace negative", claim(preempt_grace_s=-1), False, "preempt_grace_s"),
    ("holder", claim(holder={"name": "n", "pid": PID_MAX, "host": "h", "label": "l"}), True, ""),
    ("holder null", claim(holder=None), True, ""),
    ("holder fields null", claim(holder={"name": None, "pid": None}), True, ""),
    ("pid over the limit", claim(holder={"pid": PID_MAX + 1}), False, "pid"),
    ("pid negative", claim(holder={"pid": -1}), False, "pid"),
    ("pid a string", claim(holder={"pid": "12"}), False, "pid"),
    ("holder name a number", claim(holder={"name": 5}), False, "name"),
    ("holder a list", claim(holder=[1]), False, "holder"),
    ("wait at the limit", claim(wait_s=MAX_WAIT_S), True, ""),
    ("wait over it", claim(wait_s=MAX_WAIT_S + 1), False, "wait_s"),
    ("wait negative", claim(wait_s=-1), False, "wait_s"),
    ("wait a string", claim(wait_s="long"), False, "wait_s"),
    ("ttl at its minimum", claim(ttl_s=MIN_TTL_S), True, ""),
    ("ttl below it", claim(ttl_s=MIN_TTL_S / 2), False, "ttl_s"),
    ("ttl at its maximum", claim(ttl_s=MAX_TTL_S), True, ""),
    ("ttl over it", claim(ttl_s=MAX_TTL_S + 1), False, "ttl_s"),
    ("key at its shortest", claim(key="k" * MIN_KEY_LEN), True, ""),
    ("key shorter", claim(key="k" * (MIN_KEY_LEN - 1)), False, "key"),
    ("key at its longest", claim(key="k" * MAX_KEY_LEN), True, ""),
    ("key longer", claim(key="k" * (MAX_KEY_LEN + 1)), False, "key"),
    ("key with a space", claim(key="k" * MIN_KEY_LEN + " "), False, "key"),
    ("an unknown field", claim(colour="red"), False, "colour"),
    ("no claim", {"holder": {}}, False, "claim"),
    ("claim a string", {"claim": "x"}, False, "claim"),
]
TOKENS: List[Tuple[str, Dict[str, Any], bool, str]] = [
    ("name", {"name": "alice"}, True, ""),
    ("name at its longest, admin", {"name": "a" * 64, "admin": True, "queue": ""}, True, ""),
    ("a queue", {"name": "bob", "admin": False, "queue": "team-a"}, True, ""),
    ("admin in a queue", {"name": "bob", "admin": True, "queue": "team-a"}, False, "admin"),
    ("name too long", {"name": "a" * 65}, False, "name"),
    ("name with a space", {"name": "x y"}, False, "name"),
    ("the server's own name", {"name": "admin"}, False, "name"),
    ("no name", {"admin": True}, False, "name"),
    ("admin a string", {"name": "bob", "admin": "yes"}, False, "admin"),
    ("queue not a DNS label", {"name": "bob", "queue": "Team"}, False, "queue"),
    ("an unknown field", {"name": "bob", "colour": 1}, False, "colour"),
]
QUEUES: List[Tuple[str, Dict[str, Any], bool, str]] = [
    ("quota", {"quota": 0.5}, True, ""),
    ("quota, weight and limit", {"quota": 0.5, "weight": MAX_WEIGHT, "limit": 1}, True, ""),
    ("quota negative", {"quota": -1}, False, "quota"),
    ("quota over the limit", {"quota": MAX_QUEUE_GPUS + 1}, False, "quota"),
    ("quota a string", {"quota": "1"}, False, "quota"),
    ("no quota", {"weight": 1}, False, "quota"),
    ("weight 0", {"quota": 0.5, "weight": 0}, False, "weight"),
    ("weight over the limit", {"quota": 0.5, "weight": MAX_WEIGHT * 2}, False, "weight"),
    ("limit negative", {"quota": 0, "limit": -1}, False, "limit"),
    ("an unknown field", {"quota": 0.5, "name": "b"}, False, "name"),
]


def schema_accepts(document: Dict[str, Any], component: str, body: Dict[str, Any]) -> bool:
    """Whether the document's component schema accepts `body` (JSON Schema 2020-12, as OpenAPI 3.1)."""
    schema = {**document, "$ref": f"#/components/schemas/{component}"}  # refs resolve against the document
    return jsonschema.Draft202012Validator(schema).is_valid(body)


def check(r: httpx.Response, case: str, accepted: bool, field: str) -> None:
    """The server's answer agrees with the document's verdict on the body."""
    if accepted:
        code = None if r.status_code < 300 else r.json()["error"]["code"]
        assert r.status_code < 300 or code in POOL_CODES, (case, r.status_code, r.text)
        return
    assert r.status_code in (400, 422), (case, r.status_code, r.text)
    message = r.json()["error"]["message"]
    assert "\n" not in message and field in message, (case, message)


@pytest.mark.parametrize("fast_path", ["1", "0"], ids=["fast_path", "routers"])
def test_a_claim_the_document_refuses_is_refused_and_one_it_accepts_is_not(server_factory, monkeypatch, fast_path):
    monkeypatch.setenv("GPUPOOL_FAST_PATH", fast_path)  # the server subprocess inherits it
    s = server_factory()
    assert httpx.put(f"{s.url}/v1/queues/team-a", json={"quota": 1}, headers=s.headers()).status_code == 200
    document = httpx.get(s.url + "/openapi.json").json()
    with httpx.Client(headers=s.headers(), timeout=30) as http:
        for case, body, accepted, field in CLAIMS:
            assert schema_accepts(document, "ClaimRequest", body) is accepted, case
            r = http.post(s.url + "/v1/leases", json=body)
            check(r, case, accepted, field)
            if r.status_code == 201:
                # 200, or 404 for a lease whose TTL (as short as MIN_TTL_S) ran out meanwhile
                assert http.delete(f"{s.url}/v1/leases/{r.json()['id']}").status_code in (200, 404)


def test_token_and_queue_bodies_the_document_refuses_are_refused(running_server):
    s = running_server
    document = httpx.get(s.url + "/openapi.json").json()
    assert httpx.put(f"{s.url}/v1/queues/team-a", json={"quota": 0}, headers=s.headers()).status_code == 200
    with httpx.Client(headers=s.headers(), timeout=30) as http:
        for case, body, accepted, field in TOKENS:
            assert schema_accepts(document, "TokenRequest", body) is accepted, case
            check(http.post(s.url + "/v1/tokens", json=body), case, accepted, field)
        for case, body, accepted, field in QUEUES:
            assert schema_accepts(document, "QueueRequest", body) is accepted, case
            check(http.put(f"{s.url}/v1/queues/b", json=body), case, accepted, field)


def test_one_rounding_rule_in_the_code_and_the_document(running_server):
    """A fraction's MiB round down (k shares of 1/k fit a GPU whose MiB count k does not divide),
    never to 0; the document's description says the docstring of the code that does it."""
    h100 = Device("GPU-0", 0, "H100", 81_559)
    assert GpuRequest(1, fraction=0.5).memory_on(h100) == 40_779  # down: 2 x 40,780 would not fit
    assert GpuRequest(1, fraction=1 / 3).memory_on(h100) * 3 <= h100.memory_mib
    assert GpuRequest(1, fraction=MIN_FRACTION).memory_on(Device("GPU-1", 1, "small", 1024)) == 1  # never 0
    assert math.floor(0.3 * 1000) == GpuRequest(1, fraction=0.3).memory_on(Device("GPU-2", 2, "k", 1000))
    document = httpx.get(running_server.url + "/openapi.json").json()
    description = document["components"]["schemas"]["GpuRequestBody"]["properties"]["fraction"]["description"]
    rule = (GpuRequest.memory_on.__doc__ or "").split("\n", 1)[0].split(": ", 1)[-1]
    assert "rounded down" in rule and rule in description and "up" not in description
