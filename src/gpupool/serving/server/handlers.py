"""The server's side of the API, free of any web framework: identify, claim, release, the runner's
timed reports, and the operations only a server answers (the tokens, the doctor).

The routes (`routes`, `operation_routes`) call these with the caller's Identity from their auth
dependency. Short pool calls run inline on the event loop: each is one small
SQLite transaction (well under a millisecond), cheaper than the hop to a
worker thread, and a waiting claim polls with `asyncio.sleep`, so the loop is
never held for the length of a wait.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Mapping, Optional, Tuple

from pydantic import ValidationError

from ...core.attestation import TICKET_FIELD
from ...core.errors import (
    Forbidden,
    InvalidClaim,
    InvalidInput,
    Unavailable,
    Unsatisfiable,
)
from ...core.model import Claim, Holder, Lease
from ...core.operations import Operation, invoke
from ...core.suspension import RESUMING, RUNNING, SUSPENDED, SUSPENDING
from ...pooling.pool import Pool, Waiter, waiter_pauses
from ..enforcement.attest import AttestKeys
from .auth import (
    ANONYMOUS,
    Authenticator,
    Identity,
    TokenInfo,
    create_token,
    list_tokens,
    require_queue,
    revoke_token,
    rotate_token,
)
from .metrics import CLAIM_RESULTS, Metrics
from .models import ClaimRequest, ReleaseRequest, explain, validated
from .wire import json_object

if TYPE_CHECKING:  # the doctor loads when asked
    from ...pooling.pool.doctor import Report as DoctorReport

log = logging.getLogger(__name__)

Disconnected = Callable[[], Awaitable[bool]]


class LeaseApi:
    """Lease operations over one pool, with auth and metrics."""

    def __init__(
        self,
        pool: Pool,
        auth: Optional[Authenticator],
        metrics: Metrics,
        default_ttl_s: float,
        keys: Optional[AttestKeys] = None,
    ) -> None:
        self.pool = pool
        # Lease keys for the claim's answer only: the runner attests its pid with one (enforcement/attest).
        self.keys = keys
        self.auth = auth
        self.metrics = metrics
        self.default_ttl_s = default_ttl_s
        # labels() hashes and locks on every call; the children never change.
        self._claims_by_result = {result: metrics.claims.labels(result) for result in CLAIM_RESULTS}
        # A runner's step by the state it ends in: parked (a suspend), running again (a resume).
        self._step_seconds = {SUSPENDED: metrics.suspend_seconds, RUNNING: metrics.resume_seconds}

    def identify(self, authorization: Optional[str]) -> Identity:
        """The Identity of an `Authorization` header value; ANONYMOUS (admin) when auth is off."""
        return ANONYMOUS if self.auth is None else self.auth.identify(authorization)

    def claim_denied(self) -> None:
        """Count a claim refused for its token (the auth dependency refused it before `claim` ran)."""
        self._claims_by_result["denied"].inc()

    async def claim(self, identity: Identity, raw: bytes, disconnected: Disconnected) -> Dict[str, Any]:
        """POST /v1/leases: the granted lease as a dict; counts and times every outcome."""
        started = time.perf_counter()
        result = "error"
        try:
            claim, holder, wait_s, ttl_s, key = parse_claim(raw, identity, self.auth is not None, self.default_ttl_s)
            lease = await self._claim(claim, holder, wait_s, ttl_s, disconnected, key)
            result = "granted"
            granted = lease.to_dict()
            if self.keys is not None:  # in the claimant's answer only, never in a status or listing
                granted[TICKET_FIELD] = self.keys.ticket(lease.id).to_dict()
            return granted
        except Unsatisfiable:
            result = "unsatisfiable"
            raise
        except Unavailable:
            result = "unavailable"
            raise
        except InvalidInput:
            result = "invalid"
            raise
        except Forbidden:  # a queue its token may not claim in
            result = "denied"
            raise
        finally:
            self._claims_by_result[result].inc()
            self.metrics.claim_latency.observe(time.perf_counter() - started)

    def release(self, identity: Identity, lease_id: str, raw: bytes = b"") -> Dict[str, Any]:
        """DELETE /v1/leases/{id}: the lease gives its slices back (its holder or an admin); the body
        (`ReleaseRequest`, optional) carries its command's exit code for the history, which also
        keeps who released it (an admin token's name is its owner's where the lease is its own)."""
        body = validated(ReleaseRequest, json_object(raw)) if raw.strip() else None
        exit_code, timed_out = (body.exit_code, bool(body.timed_out)) if body is not None else (None, False)
        self.pool.release(lease_id, identity.requester, exit_code, identity.name, timed_out)
        self.metrics.releases.inc()
        return {"released": lease_id}

    # --- a server's own operations (`serve` in the operation table: no pool method answers them) ---
    def create_token(self, name: str, admin: bool, queue: Optional[str], replace: bool) -> str:
        """POST /v1/tokens: a new named token (`replace`: the name's old one stops); its queue must exist."""
        if queue:
            require_queue(self.pool, queue)
        token = create_token(self.pool.store, name, admin, "api", queue or "", replace)
        self._forget()  # this process must see the replacement now, not after the lookup cache expires
        return token

    def list_tokens(self) -> List[TokenInfo]:
        """GET /v1/tokens: the named tokens."""
        return list_tokens(self.pool.store)

    def revoke_token(self, name: str) -> None:
        """DELETE /v1/tokens/{name}: the token stops, refused here from now on."""
        revoke_token(self.pool.store, name)
        self._forget()

    def rotate_token(self, name: str) -> str:
        """POST /v1/tokens/{name}/rotate: a new token for the name, as it was; the old one stops."""
        token = rotate_token(self.pool.store, name, "api")
        self._forget()
        return token

    def doctor(self) -> DoctorReport:
        """GET /v1/doctor: the pool's invariants and its database checked."""
        from ...pooling.pool.doctor import check_state

        return check_state(self.pool.state_dir)

    def _forget(self) -> None:
        if self.auth is not None:
            self.auth.forget()

    def timed_step(self, op: Operation[Lease], args: Mapping[str, Any], identity: Identity) -> Lease:
        """A runner's report of a step (`op`: parked, restored), and the step's seconds observed:
        from its start (the suspension's `since`, read before the report moves it) to the report,
        when the lease reached the state `op.timed`."""
        before = self.pool.lease(args["lease_id"]).suspension
        after = invoke(self.pool, op, args, identity.requester, identity.name)
        if before is not None and before.state in (SUSPENDING, RESUMING) and after.state == op.timed:
            self._step_seconds[op.timed].observe(max(0.0, self.pool.clock() - before.since))
        return after

    async def _claim(
        self, claim: Claim, holder: Holder, wait_s: float, ttl_s: float, disconnected: Disconnected, key: str = ""
    ) -> Lease:
        """Grant now, or poll the queue ticket until granted, the wait runs out or the client leaves."""
        claims = self.pool.claims  # the waiter protocol of pool/claims.py
        started = claims.begin(claim, holder, wait_s, ttl_s, key)
        if isinstance(started, Lease):
            return started
        waiter: Optional[Waiter] = started
        try:
            # The pool's one backoff schedule, over the wait the claim gets: longer than `wait_s`
            # (even 0) while it waits for the leases it preempted to stop.
            for pause in waiter_pauses(started):
                await asyncio.sleep(pause)
                lease = claims.try_grant(started)
                if lease is not None:
                    waiter = None
                    return lease
                if await disconnected():
                    raise Unavailable("the client went away while its claim waited")
            raise claims.timed_out(started, started.wait_s)
        finally:
            if waiter is not None:
                claims.cancel(waiter)


def parse_claim(
    raw: bytes, identity: Identity, auth_on: bool, default_ttl_s: float
) -> Tuple[Claim, Holder, float, float, str]:
    """The claim request body -> (claim, holder, wait_s, ttl_s, key), validated by `ClaimRequest`."""
    body = json_object(raw)
    try:
        request = ClaimRequest.model_validate(body)
    except ValidationError as err:
        # The request's own shape (a field it does not have, a holder that is not an object) is
        # malformed input (400); every rule of the claim and its fields, a claim that can never
        # be valid (422).
        (loc, kind) = err.errors()[0]["loc"], err.errors()[0]["type"]
        shape = len(loc) == 1 and (kind == "extra_forbidden" or loc == ("holder",))
        raise (InvalidInput if shape else InvalidClaim)(explain(ClaimRequest, err)) from None
    claim = bind_queue(request.claim.to_core(), identity)
    holder = request.holder.to_core() if request.holder is not None else Holder()
    if auth_on:
        # The token decides who holds the lease: nobody can claim as someone else.
        holder = Holder(identity.name, holder.pid, holder.host, holder.label)
    elif not holder.name:
        holder = Holder("anonymous", holder.pid, holder.host, holder.label)
    wait_s = 0.0 if request.wait_s is None else request.wait_s
    ttl_s = default_ttl_s if request.ttl_s is None else request.ttl_s
    return claim, holder, wait_s, ttl_s, request.key or ""


def bind_queue(claim: Claim, identity: Identity) -> Claim:
    """The claim in its token's queue: a token bound to a queue claims in that one only (403 for
    another), and a claim that names none goes to it."""
    if not identity.queue or claim.queue == identity.queue:
        return claim
    if claim.queue:
        raise Forbidden(
            f"token {identity.name!r} may claim in queue {identity.queue!r} only, not {claim.queue!r}: "
            f"drop --queue or use a token of queue {claim.queue!r}"
        )
    return dataclasses.replace(claim, queue=identity.queue)


def dumps(data: Any) -> bytes:
    """Compact JSON bytes of a response body."""
    return json.dumps(data, separators=(",", ":")).encode()
