"""The leases, their slices and their suspension records, inside one transaction (a part of `Tx`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ...core.model import Holder, Lease, Slice
from .schema import KEY_INDEX
from .tx_base import TxBase

if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Tuple

    from ...core.suspension import Suspension

# The lease columns _lease() reads, in its order.
LEASE_COLUMNS = (
    "id, holder, ttl_s, created_at, expires_at, queue, priority, preempt_grace_s, preempted_at, idle_suspend_s"
)
# A lease with its suspension record, if any (most have none: the LEFT JOIN finds no row).
LEASE_FROM = f"SELECT {LEASE_COLUMNS}, suspensions.record FROM leases LEFT JOIN suspensions ON lease_id = id"


class LeaseTx(TxBase):
    """Leases and slices: grant, renew, take, preempt, suspend."""

    # --- leases ---------------------------------------------------------------
    def allocated(self) -> Dict[str, int]:
        """MiB held per device uuid by the leases in the table."""
        rows = self.conn.execute("SELECT device_uuid, SUM(memory_mib) FROM slices GROUP BY device_uuid")
        return {uuid: int(total) for uuid, total in rows}

    def next_expiry(self) -> float:
        """The earliest expires_at of any lease (inf when there are none)."""
        row = self.conn.execute("SELECT MIN(expires_at) FROM leases").fetchone()
        return float("inf") if row is None or row[0] is None else float(row[0])

    def take_lease(self, lease_id: str) -> Optional[Tuple[str, List[Tuple[str, int]]]]:
        """Delete a lease and its slices: (holder name, [(device uuid, MiB)]), or None when absent.

        Roll the transaction back to undo it (e.g. when the requester may not release it).
        """
        slices = self.conn.execute(
            "DELETE FROM slices WHERE lease_id = ? RETURNING device_uuid, memory_mib", (lease_id,)
        ).fetchall()
        rows = self.conn.execute("DELETE FROM leases WHERE id = ? RETURNING holder_name", (lease_id,)).fetchall()
        self.changed.append(lease_id)
        return (rows[0][0], slices) if rows else None

    def insert_lease(self, lease: Lease, key: str = "") -> None:
        """Write `lease`; `key` is the client's key of the claim it answers ('' = none)."""
        self.conn.execute(
            "INSERT INTO leases (id, holder_name, holder, ttl_s, created_at, expires_at, queue, priority, "
            "preempt_grace_s, preempted_at, claim_key, idle_suspend_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                lease.id,
                lease.holder.name,
                json.dumps(lease.holder.to_dict()),
                lease.ttl_s,
                lease.created_at,
                lease.expires_at,
                lease.queue,
                lease.priority,
                lease.preempt_grace_s,
                lease.preempted_at,
                key,
                lease.idle_suspend_s,
            ),
        )
        insert = "INSERT INTO slices (lease_id, device_uuid, memory_mib, grp) VALUES (?, ?, ?, ?)"
        if len(lease.slices) == 1:  # the common case; execute() is cheaper than executemany()
            s = lease.slices[0]
            self.conn.execute(insert, (lease.id, s.device_uuid, s.memory_mib, s.group))
        else:
            self.conn.executemany(insert, [(lease.id, s.device_uuid, s.memory_mib, s.group) for s in lease.slices])

    def get_lease(self, lease_id: str) -> Optional[Lease]:
        row = self.conn.execute(f"{LEASE_FROM} WHERE id = ?", (lease_id,)).fetchone()
        if row is None:
            return None
        slices = self.conn.execute(
            "SELECT device_uuid, memory_mib, grp FROM slices WHERE lease_id = ? ORDER BY rowid", (lease_id,)
        ).fetchall()
        return _lease(row, slices)

    def leases(self, where: str = "", params: Iterable[Any] = ()) -> List[Lease]:
        """Leases in creation order, optionally filtered by a SQL condition on `leases`."""
        rows = self.conn.execute(
            f"{LEASE_FROM} " + (f"WHERE {where} " if where else "") + "ORDER BY created_at, id",
            tuple(params),
        ).fetchall()
        if not rows:
            return []
        by_lease: Dict[str, List[Tuple[str, int, int]]] = {}
        if len(rows) == 1:
            srows = self.conn.execute(
                "SELECT lease_id, device_uuid, memory_mib, grp FROM slices WHERE lease_id = ? ORDER BY rowid",
                (rows[0][0],),
            )
        else:
            srows = self.conn.execute("SELECT lease_id, device_uuid, memory_mib, grp FROM slices ORDER BY rowid")
        for lease_id, uuid, mib, grp in srows:
            by_lease.setdefault(lease_id, []).append((uuid, mib, grp))
        return [_lease(row, by_lease.get(row[0], [])) for row in rows]

    def ensure_key_index(self) -> None:
        """Create the index of leases by claim key if missing (schema.KEY_INDEX)."""
        self.conn.execute(KEY_INDEX)

    def lease_by_key(self, key: str, holder_name: str) -> Optional[Lease]:
        """The lease granted to the claim with client key `key` of `holder_name`, or None."""
        row = self.conn.execute(
            "SELECT id FROM leases WHERE claim_key = ? AND claim_key != '' AND holder_name = ?", (key, holder_name)
        ).fetchone()
        return None if row is None else self.get_lease(row[0])

    def has_expired_leases(self, now: float) -> bool:
        return self.conn.execute("SELECT 1 FROM leases WHERE expires_at < ? LIMIT 1", (now,)).fetchone() is not None

    def delete_lease(self, lease_id: str) -> bool:
        self.changed.append(lease_id)
        self.conn.execute("DELETE FROM slices WHERE lease_id = ?", (lease_id,))
        return self.conn.execute("DELETE FROM leases WHERE id = ?", (lease_id,)).rowcount > 0

    def set_lease_expiry(self, lease_id: str, expires_at: float, undo_preemption: bool = False) -> None:
        """Move the lease's expiry; `undo_preemption` also makes it no longer preempted."""
        if not undo_preemption:
            self.conn.execute("UPDATE leases SET expires_at = ? WHERE id = ?", (expires_at, lease_id))
        else:
            self.conn.execute(
                "UPDATE leases SET expires_at = ?, preempted_at = NULL WHERE id = ?", (expires_at, lease_id)
            )

    def set_lease_preempted(self, lease_id: str, preempted_at: float, expires_at: float) -> None:
        """Mark a lease preempted; it is reaped at `expires_at` unless released before."""
        self.changed.append(lease_id)
        self.conn.execute(
            "UPDATE leases SET preempted_at = ?, expires_at = ? WHERE id = ?", (preempted_at, expires_at, lease_id)
        )

    # --- suspensions (core/suspension.py) ----------------------------------------
    def put_suspension(self, lease_id: str, suspension: Suspension) -> None:
        """Write the suspension record of `lease_id` (replacing the one before)."""
        self.changed.append(lease_id)
        self.conn.execute(
            "INSERT OR REPLACE INTO suspensions (lease_id, state, record) VALUES (?, ?, ?)",
            (lease_id, suspension.state, json.dumps(suspension.to_dict())),
        )

    def suspensions(self, state: str) -> List[str]:
        """The ids of the leases in `state`, oldest suspension first."""
        return [
            r[0] for r in self.conn.execute("SELECT lease_id FROM suspensions WHERE state = ? ORDER BY rowid", (state,))
        ]

    def has_suspensions(self) -> bool:
        return self.conn.execute("SELECT 1 FROM suspensions WHERE state != 'running' LIMIT 1").fetchone() is not None

    def set_slices(self, lease_id: str, slices: Iterable[Slice]) -> None:
        """Replace the GPU memory `lease_id` holds (none while it is suspended)."""
        self.conn.execute("DELETE FROM slices WHERE lease_id = ?", (lease_id,))
        self.conn.executemany(
            "INSERT INTO slices (lease_id, device_uuid, memory_mib, grp) VALUES (?, ?, ?, ?)",
            [(lease_id, s.device_uuid, s.memory_mib, s.group) for s in slices],
        )

    def has_queued_leases(self) -> bool:
        """Whether any live lease names a queue (a queue with leases may not be deleted)."""
        return self.conn.execute("SELECT 1 FROM leases WHERE queue != '' LIMIT 1").fetchone() is not None


def _lease(row: Tuple[Any, ...], slices: Iterable[Tuple[str, int, int]]) -> Lease:
    lease_id, holder, ttl_s, created_at, expires_at, queue, priority, grace, preempted_at, idle_s, suspension = row
    return Lease(
        id=lease_id,
        holder=Holder.from_dict(json.loads(holder), recorded=True),
        slices=tuple(Slice(u, int(m), int(g)) for u, m, g in slices),
        ttl_s=float(ttl_s),
        created_at=float(created_at),
        expires_at=float(expires_at),
        queue=str(queue),
        priority=int(priority),
        preempt_grace_s=float(grace),
        preempted_at=None if preempted_at is None else float(preempted_at),
        suspension=None if suspension is None else _suspension(suspension),
        idle_suspend_s=None if idle_s is None else float(idle_s),
    )


def _suspension(record: str) -> Suspension:
    """The stored suspension record (one in state running is kept for its seconds and last error)."""
    from ...core.suspension import Suspension  # lazily: most leases never suspend

    return Suspension.from_dict(json.loads(record))
