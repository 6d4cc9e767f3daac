"""A server's start after an outage renews leases: the downtime of the last server is no holder's fault.

("Renew", not "resume": resuming is a suspended lease's, pool/suspend.py and core/resumption.py.)

Every lease live at the last server's last sweep (`ALIVE_KEY`, stamped by each sweep of a
serving pool) gets a full TTL from the return; a preempted one has its preemption and reaping
moved by the downtime (its runner may not have heard of it yet, and its claimant waits for
it); every waiting claim with a client key keeps its ticket, owned by no process, for
`TICKET_REATTACH_S`, so its client re-attaches to its place in the queue. A preemption half-way
(leases marked, their claimant still waiting) thus completes once the claimant is back; when no
waiting claim outlived the stop to take their room, it is undone instead: the leases are no longer
preempted, and a runner that had not yet heard of it never will.

Why a stamp and not "renew every unreleased lease": leases (and tickets) that had run out
while the server still ran, their holders gone, are reaped as before instead of being revived
for another TTL; and a state dir no server ever served (embedded pools only, where every
`gpupool run` opens the database) has no stamp, so nothing there is renewed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...core.model import reap_at
from ...core.outage import TICKET_REATTACH_S
from ..store.tx import Tx

# meta key: when a serving pool (a server's, a node agent's) last swept, in epoch seconds
ALIVE_KEY = "server_alive"


@dataclass(frozen=True)
class Renewed:
    """What a start renewed: the downtime it made up for, leases renewed, tickets kept."""

    down_s: float = 0.0
    leases: int = 0
    tickets: int = 0
    undone: int = 0  # preemptions undone: no waiting claim outlived the stop to take their room


def stamp_alive(tx: Tx, now: float) -> None:
    """Record that a server serves this state dir at `now` (each sweep of a serving pool)."""
    tx.set_meta(ALIVE_KEY, repr(now))


def renew(tx: Tx, now: float) -> Renewed:
    """Renew, in the caller's transaction, what was live at the last stamp, and stamp `now`.

    One transaction: a kill during a start leaves the old stamp, and the next start renews the same.
    """
    tx.ensure_key_index()  # only servers take claims with keys
    stamp = tx.meta(ALIVE_KEY)
    stamp_alive(tx, now)
    try:
        alive_at = float(stamp) if stamp is not None else math.nan
    except ValueError:  # a damaged row: renew nothing rather than guess
        alive_at = math.nan
    if not math.isfinite(alive_at):
        return Renewed()
    down = max(0.0, now - alive_at)  # a clock that went back makes up for nothing
    kept = tx.keep_keyed_tickets(alive_at, now + TICKET_REATTACH_S)
    leases = tx.leases("expires_at >= ?", (alive_at,))
    undone = 0
    for lease in leases:
        if lease.preempted_at is None or not kept:
            if lease.preempted_at is not None:
                undone += 1
            tx.set_lease_expiry(lease.id, max(lease.expires_at, now + lease.ttl_s), undo_preemption=True)
            continue
        moved = replace(lease, preempted_at=lease.preempted_at + down)
        # It may still be renewed by heartbeats up to its reaping, as before the outage.
        expires_at = min(max(lease.expires_at + down, now + lease.ttl_s), reap_at(moved) or math.inf)
        tx.set_lease_preempted(lease.id, lease.preempted_at + down, expires_at)
    return Renewed(down, len(leases), kept, undone)
