"""The one interface every pool client implements (HTTP or embedded)."""

from __future__ import annotations

import abc

from ..core.model import Claim, Holder, Lease, PoolStatus


class PoolClient(abc.ABC):
    """Claim, heartbeat, release and inspect leases of one pool.

    Errors are raised as `gpupool.core.errors.GpupoolError` subclasses:
    `InvalidClaim`/`Unsatisfiable` for claims that can never be granted,
    `Unavailable` when it does not fit within `wait_s`, `NotFound`,
    `Forbidden`, `Unauthorized`, `ServerUnreachable`.
    """

    #: where this pool lives: a URL, or "embedded:<state dir>"
    address: str = ""

    @abc.abstractmethod
    def claim(self, claim: Claim, holder: Holder, *, wait_s: float = 0.0, ttl_s: float = 30.0) -> Lease:
        """Grant `claim` to `holder`, waiting in the FIFO queue up to `wait_s` seconds."""

    @abc.abstractmethod
    def heartbeat(self, lease_id: str) -> Lease:
        """Extend the lease by its TTL; returns the lease with its new expiry."""

    @abc.abstractmethod
    def release(self, lease_id: str) -> None:
        """Give the lease's memory back to the pool."""

    @abc.abstractmethod
    def status(self) -> PoolStatus:
        """Devices, their allocation, and the live leases."""

    def close(self) -> None:  # noqa: B027  # optional hook: most clients have nothing to free
        """Free connections or files; the default has nothing to free."""

    def __enter__(self) -> PoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
