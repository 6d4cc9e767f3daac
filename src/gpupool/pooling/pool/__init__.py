"""The pool service: claim / heartbeat / release / expire / queue, over the SQLite store (stdlib only).

Owns: `Pool` (grants, the waiting queue, expiry, device health, the node's isolation and usage
records, queues with quotas and preemption, the lease history), `Waiter`, and `waiter_pauses` /
`poll_delays` (the one backoff of a waiting claim).
Modules: service (Pool, the façade), ledger (the shared transaction state and checks), claims
(grants, heartbeat, release), tickets (waiting claims), watch (a runner's watch), suspend
(suspension), accounting (queues, history, usage), admission (queues: who goes next, whom to
preempt), renewal (a server's start after an outage), doctor.
May import: core, store, devices, isolation (floor 1: its own floor and core); stdlib only.
"""

from .service import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S, Pool, Waiter, poll_delays, waiter_pauses

__all__ = ["Pool", "Waiter", "DEFAULT_TTL_S", "MIN_TTL_S", "MAX_TTL_S", "poll_delays", "waiter_pauses"]
