"""Typed queries inside one transaction: devices, leases and slices, tickets, tokens, queues, history.

Rows go in and out as core model objects; the pool decides what to do with them.
"""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING

from ..core.model import Device, Holder, Lease, Slice
from ..core.suspension import BY_OWNER, RESUMING, SUSPENDED
from .schema import KEY_INDEX

# How many of the newest history rows `Tx.how_ended` reads: a lease whose runner still watches it
# ended moments ago, so it is among them; an older or unknown id costs no scan of the whole history.
ENDED_LOOKBACK = 10000

if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

    from ..core.queues import QueueSpec
    from ..core.suspension import Suspension

# The lease columns _lease() reads, in its order.
LEASE_COLUMNS = (
    "id, holder, ttl_s, created_at, expires_at, queue, priority, preempt_grace_s, preempted_at, idle_suspend_s"
)
# A lease with its suspension record, if any (most have none: the LEFT JOIN finds no row).
LEASE_FROM = f"SELECT {LEASE_COLUMNS}, suspensions.record FROM leases LEFT JOIN suspensions ON lease_id = id"


class Tx:
    """Queries on a connection that is inside a transaction opened by `Store`."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    # --- meta -----------------------------------------------------------------
    def meta(self, key: str) -> Optional[str]:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def take_meta(self, key: str) -> Optional[str]:
        """The value of `key`, deleted as it is read (a note read once); None when there is none."""
        row = self.conn.execute("DELETE FROM meta WHERE key = ? RETURNING value", (key,)).fetchone()
        return row[0] if row else None

    # --- devices --------------------------------------------------------------
    def devices_generation(self) -> int:
        """Bumped by every change to the device table, so callers can cache devices."""
        return int(self.meta("devices_gen") or 0)

    def devices(self) -> List[Device]:
        rows = self.conn.execute(
            "SELECT uuid, idx, name, memory_mib, node, healthy FROM devices ORDER BY node, idx"
        ).fetchall()
        return [Device(u, i, n, m, node, bool(h)) for u, i, n, m, node, h in rows]

    def replace_devices(self, devices: Sequence[Device]) -> bool:
        """Make the table hold exactly `devices`; bumps the generation and returns True when anything changed."""
        if list(devices) == self.devices():
            return False
        self.conn.execute("DELETE FROM devices")
        self.conn.executemany(
            "INSERT INTO devices (uuid, idx, name, memory_mib, node, healthy) VALUES (?, ?, ?, ?, ?, ?)",
            [(d.uuid, d.index, d.name, d.memory_mib, d.node, int(d.healthy)) for d in devices],
        )
        self.set_meta("devices_gen", str(self.devices_generation() + 1))
        return True

    def data_version(self) -> int:
        """Changes whenever another connection (this process or another) committed a change."""
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

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
        self.conn.execute(
            "UPDATE leases SET preempted_at = ?, expires_at = ? WHERE id = ?", (preempted_at, expires_at, lease_id)
        )

    # --- suspensions (core/suspension.py) ----------------------------------------
    def put_suspension(self, lease_id: str, suspension: Suspension) -> None:
        """Write the suspension record of `lease_id` (replacing the one before)."""
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

    # --- tickets (the FIFO queue) ---------------------------------------------
    def add_ticket(
        self,
        claim: Dict[str, Any],
        holder: Dict[str, Any],
        host: str,
        pid: int,
        now: float,
        expires_at: float,
        queue: str = "",
        priority: int = 0,
        key: str = "",
    ) -> int:
        cur = self.conn.execute(
            "INSERT INTO tickets (claim, holder, host, pid, created_at, expires_at, queue, priority, claim_key) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (json.dumps(claim), json.dumps(holder), host, pid, now, expires_at, queue, priority, key),
        )
        ticket_id = cur.lastrowid
        if ticket_id is None:  # never after an INSERT; sqlite3 types it Optional
            raise TypeError("INSERT INTO tickets returned no rowid")
        return int(ticket_id)

    def head_ticket(self) -> Optional[int]:
        """The next ticket of a pool without queues: highest priority, then first come."""
        row = self.conn.execute("SELECT id FROM tickets WHERE held = 0 ORDER BY priority DESC, id LIMIT 1").fetchone()
        return row[0] if row else None

    def ticket_count(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM tickets").fetchone()[0])

    def unheld_ticket_count(self) -> int:
        """Tickets a grant may take: those not held (gpupool claim hold)."""
        return int(self.conn.execute("SELECT COUNT(*) FROM tickets WHERE held = 0").fetchone()[0])

    def tickets_before(self, ticket_id: int) -> int:
        """Tickets ahead of `ticket_id` in a pool without queues (head_ticket's order)."""
        row = self.conn.execute(
            "SELECT COUNT(*) FROM tickets t, tickets me WHERE me.id = ? AND t.held = 0 "
            "AND (t.priority > me.priority OR (t.priority = me.priority AND t.id < me.id))",
            (ticket_id,),
        ).fetchone()
        return int(row[0])

    def waiting(self) -> List[Tuple[int, str, int, str]]:
        """(id, queue, priority, claim JSON) of every waiting claim a grant may take (not held), in ticket order."""
        return self.conn.execute("SELECT id, queue, priority, claim FROM tickets WHERE held = 0 ORDER BY id").fetchall()

    def waiting_by_queue(self, now: float) -> Dict[str, int]:
        """Live tickets per queue name."""
        rows = self.conn.execute("SELECT queue, COUNT(*) FROM tickets WHERE expires_at >= ? GROUP BY queue", (now,))
        return {queue: int(n) for queue, n in rows}

    def refresh_ticket(self, ticket_id: int, expires_at: float) -> Optional[Tuple[int, bool]]:
        """Keep the ticket alive until `expires_at`: its (priority, held) now, or None when it is gone."""
        row = self.conn.execute(
            "UPDATE tickets SET expires_at = ? WHERE id = ? RETURNING priority, held", (expires_at, ticket_id)
        ).fetchone()
        return None if row is None else (int(row[0]), bool(row[1]))

    def ticket_holder(self, ticket_id: int) -> Optional[str]:
        """The holder name of the waiting claim `ticket_id`, or None when there is none."""
        row = self.conn.execute(
            "SELECT COALESCE(json_extract(holder, '$.name'), '') FROM tickets WHERE id = ?", (ticket_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    def set_ticket_held(self, ticket_id: int, held: bool) -> None:
        self.conn.execute("UPDATE tickets SET held = ? WHERE id = ?", (int(held), ticket_id))

    def set_ticket_priority(self, ticket_id: int, priority: int) -> None:
        self.conn.execute("UPDATE tickets SET priority = ? WHERE id = ?", (priority, ticket_id))

    def ticket_by_key(self, key: str, holder_name: str) -> Optional[int]:
        """The ticket of the waiting claim with client key `key` of `holder_name`, or None."""
        rows = self.conn.execute(
            "SELECT id, holder FROM tickets WHERE claim_key = ? AND claim_key != ''", (key,)
        ).fetchall()
        for ticket_id, holder in rows:
            if json.loads(holder).get("name") == holder_name:
                return int(ticket_id)
        return None

    def adopt_ticket(self, ticket_id: int, host: str, pid: int, expires_at: float) -> None:
        """Make a ticket the waiting claim of process `pid` on `host` (a client re-attached to it)."""
        self.conn.execute(
            "UPDATE tickets SET host = ?, pid = ?, expires_at = ? WHERE id = ?", (host, pid, expires_at, ticket_id)
        )

    def keep_keyed_tickets(self, live_at: float, expires_at: float) -> int:
        """Tickets with a client key that were live at `live_at` wait for their client until `expires_at`,
        owned by no process (pid 0: dropped only by expiry); returns how many."""
        return int(
            self.conn.execute(
                "UPDATE tickets SET pid = 0, expires_at = ? WHERE claim_key != '' AND expires_at >= ?",
                (expires_at, live_at),
            ).rowcount
        )

    def delete_ticket(self, ticket_id: int) -> None:
        self.conn.execute("DELETE FROM tickets WHERE id = ?", (ticket_id,))

    def tickets(self) -> List[Tuple[int, str, int, float]]:
        """(id, host, pid, expires_at) of every waiting claim, in queue order."""
        return self.conn.execute("SELECT id, host, pid, expires_at FROM tickets ORDER BY id").fetchall()

    def waiting_rows(self, now: float) -> List[Tuple[int, str, str, float, str, int, str]]:
        """(id, claim JSON, holder JSON, created_at, queue, priority, reason) of the live tickets,
        highest priority first, then the oldest."""
        return self.conn.execute(
            "SELECT id, claim, holder, created_at, queue, priority, reason FROM tickets WHERE expires_at >= ? "
            "ORDER BY priority DESC, id",
            (now,),
        ).fetchall()

    def queue_rows(self, now: float) -> List[Tuple[int, str, str, float, str, int, str, bool, str]]:
        """(id, claim JSON, holder JSON, created_at, queue, priority, reason, held, client key) of the
        live tickets, in ticket order: what `Pool.waiting` orders as the pool grants."""
        rows = self.conn.execute(
            "SELECT id, claim, holder, created_at, queue, priority, reason, held, claim_key FROM tickets "
            "WHERE expires_at >= ? ORDER BY id",
            (now,),
        ).fetchall()
        return [(*row[:7], bool(row[7]), str(row[8])) for row in rows]

    def set_ticket_reason(self, ticket_id: int, reason: str) -> None:
        self.conn.execute("UPDATE tickets SET reason = ? WHERE id = ?", (reason, ticket_id))

    # --- queues ---------------------------------------------------------------
    def queue_specs(self) -> List[QueueSpec]:
        rows = self.conn.execute(
            "SELECT name, quota, weight, limit_gpus, preempt, idle_suspend_s FROM queues ORDER BY name"
        ).fetchall()
        if not rows:  # the common pool has no queues: core.queues (and placement under it) stays unloaded
            return []
        from ..core.queues import QueueSpec

        return [QueueSpec(*row) for row in rows]

    def put_queue(self, spec: QueueSpec) -> None:
        self.conn.execute(
            "INSERT INTO queues (name, quota, weight, limit_gpus, preempt, idle_suspend_s) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET quota = excluded.quota, weight = excluded.weight, "
            "limit_gpus = excluded.limit_gpus, preempt = excluded.preempt, idle_suspend_s = excluded.idle_suspend_s",
            (spec.name, spec.quota, spec.weight, spec.limit, spec.preempt, spec.idle_suspend_s),
        )

    def delete_queue(self, name: str) -> bool:
        return self.conn.execute("DELETE FROM queues WHERE name = ?", (name,)).rowcount > 0

    def queue_busy(self, name: str) -> Tuple[int, int]:
        """(live leases, tickets) naming queue `name`."""
        leases = self.conn.execute("SELECT COUNT(*) FROM leases WHERE queue = ?", (name,)).fetchone()[0]
        tickets = self.conn.execute("SELECT COUNT(*) FROM tickets WHERE queue = ?", (name,)).fetchone()[0]
        return int(leases), int(tickets)

    # --- lease history -----------------------------------------------------------
    def record_end(
        self,
        lease_id: str,
        ended_at: float,
        reason: str,
        exit_code: Optional[int] = None,
        by: str = "",
        caller: Optional[str] = None,
    ) -> None:
        """Copy a lease that ends into the history (reason: schema.HISTORY_REASONS); call it before
        deleting the lease, in the same transaction. Its size in GPUs is its slices' MiB over their
        devices' (a device that is gone counts whole), computed by SQLite: a release stays one
        statement longer, with no rows coming back to Python. A lease that ends suspended holds no
        slices: the ones it parked give its size. Its seconds suspended (not GPU time) come from its
        suspension record: those before the record's `since`, and since then while parked. `exit_code`
        is its command's, as its runner said (None: not said). `by` is who ended it (BY_ADMIN, '' for
        nobody), and BY_OWNER instead where `caller`, the name of who asked, is its holder's. The mode
        of its last preemption (its suspension record's; '' for none) goes with it."""
        self.conn.execute(
            "INSERT INTO lease_history (lease_id, queue, holder_name, label, gpus, started_at, ended_at, reason, "
            "preempted_at, suspended_s, exit_code, ended_by, preempt_mode) SELECT l.id, l.queue, l.holder_name, "
            "COALESCE(json_extract(l.holder, '$.label'), ''), COALESCE("
            "(SELECT SUM(CASE WHEN d.memory_mib > 0 THEN s.memory_mib * 1.0 / d.memory_mib ELSE 1.0 END) "
            "FROM slices s LEFT JOIN devices d ON d.uuid = s.device_uuid WHERE s.lease_id = l.id), "
            "(SELECT SUM(CASE WHEN d.memory_mib > 0 THEN json_extract(p.value, '$.memory_mib') * 1.0 / d.memory_mib "
            "ELSE 1.0 END) FROM suspensions su JOIN json_each(su.record, '$.parked') p "
            "LEFT JOIN devices d ON d.uuid = json_extract(p.value, '$.uuid') WHERE su.lease_id = l.id), 0), "
            "l.created_at, :ended_at, :reason, l.preempted_at, COALESCE("
            "(SELECT json_extract(su.record, '$.suspended_s') + CASE WHEN su.state IN (:suspended, :resuming) "
            "THEN MAX(0, :ended_at - json_extract(su.record, '$.since')) ELSE 0 END "
            "FROM suspensions su WHERE su.lease_id = l.id), 0), :exit_code, "
            "CASE WHEN l.holder_name = :caller THEN :owner ELSE :by END, "
            "COALESCE((SELECT json_extract(su.record, '$.mode') FROM suspensions su WHERE su.lease_id = l.id), '') "
            "FROM leases l WHERE l.id = :lease_id",
            {
                "ended_at": ended_at,
                "reason": reason,
                "lease_id": lease_id,
                "suspended": SUSPENDED,
                "resuming": RESUMING,
                "exit_code": exit_code,
                "by": by,
                "caller": caller,  # None matches no holder
                "owner": BY_OWNER,
            },
        )

    def how_ended(self, lease_id: str) -> Optional[Tuple[str, str, str]]:
        """(reason, ended_by, holder name) of `lease_id` among the last ENDED_LOOKBACK leases that
        ended, or None. The history has no index on lease ids (one would cost every release a page
        written): the newest rows are read backwards by rowid, where a lease that just ended is."""
        row = self.conn.execute(
            "SELECT reason, ended_by, holder_name FROM lease_history WHERE lease_id = ? AND rowid > "
            "(SELECT COALESCE(MAX(rowid), 0) FROM lease_history) - ? ORDER BY rowid DESC LIMIT 1",
            (lease_id, ENDED_LOOKBACK),
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]), str(row[2]))

    def end_leases_of(self, holder_name: str, ended_at: float, reason: str, by: str) -> List[str]:
        """End every lease held by `holder_name` (into the history, as `record_end`); their ids."""
        ids = [row[0] for row in self.conn.execute("SELECT id FROM leases WHERE holder_name = ?", (holder_name,))]
        for lease_id in ids:
            self.record_end(lease_id, ended_at, reason, by=by)
            self.take_lease(lease_id)
        return ids

    def history(self, since: float, until: float) -> List[Tuple[str, str, str, float, float, float, float]]:
        """(queue, holder name, label, gpus, started_at, ended_at, suspended_s) of leases that ended
        after `since` and started before `until`."""
        return self.conn.execute(
            "SELECT queue, holder_name, label, gpus, started_at, ended_at, suspended_s FROM lease_history "
            "WHERE ended_at >= ? AND started_at <= ? ORDER BY ended_at",
            (since, until),
        ).fetchall()

    def lease_records(
        self, since: float, until: float
    ) -> List[Tuple[str, str, str, str, float, float, float, str, float, Optional[int], str, str]]:
        """(lease id, holder, label, queue, gpus, started_at, ended_at, reason, suspended_s, exit_code,
        ended_by, preempt_mode) of the leases that ended in [since, until], in the order they ended."""
        return self.conn.execute(
            "SELECT lease_id, holder_name, label, queue, gpus, started_at, ended_at, reason, suspended_s, exit_code, "
            "ended_by, preempt_mode "
            "FROM lease_history WHERE ended_at >= ? AND ended_at <= ? ORDER BY ended_at",
            (since, until),
        ).fetchall()

    def prune_history(self, before: float) -> int:
        """Delete the history of leases that ended before `before`; returns how many rows went."""
        return int(self.conn.execute("DELETE FROM lease_history WHERE ended_at < ?", (before,)).rowcount)

    def count_preemption(self, queue: str, mode: str, n: int = 1) -> None:
        """Count `n` more preemptions of a lease of `queue` by `mode` (n = -1 takes one back)."""
        self.conn.execute(
            "INSERT INTO preemptions (queue, mode, count) VALUES (?, ?, MAX(?, 0)) "
            "ON CONFLICT (queue, mode) DO UPDATE SET count = MAX(count + ?, 0)",
            (queue, mode, n, n),
        )

    def preemption_counts(self) -> Dict[str, Dict[str, int]]:
        """Preemptions ever, per queue and mode."""
        counts: Dict[str, Dict[str, int]] = {}
        for queue, mode, n in self.conn.execute("SELECT queue, mode, count FROM preemptions WHERE count > 0"):
            counts.setdefault(str(queue), {})[str(mode)] = int(n)
        return counts

    # --- tokens ---------------------------------------------------------------
    def put_token(
        self, name: str, token_hash: str, admin: bool, now: float, origin: str = "local", queue: str = ""
    ) -> None:
        """Create or replace the token called `name` (replacing rotates it); `origin` says who made it
        (schema.TOKEN_ORIGINS), `queue` the only queue it may claim in ("" = any)."""
        self.conn.execute("DELETE FROM tokens WHERE name = ? OR hash = ?", (name, token_hash))
        self.conn.execute(
            "INSERT INTO tokens (name, hash, admin, created_at, origin, queue) VALUES (?, ?, ?, ?, ?, ?)",
            (name, token_hash, int(admin), now, origin, queue),
        )

    def token_queue(self, token_hash: str) -> str:
        """The queue the token with this hash is bound to ("" = unbound, or no such token)."""
        row = self.conn.execute("SELECT queue FROM tokens WHERE hash = ?", (token_hash,)).fetchone()
        return str(row[0]) if row else ""

    def token_by_hash(self, token_hash: str) -> Optional[Tuple[str, bool]]:
        """(name, admin) of the token with this hash, or None."""
        row = self.token_row(token_hash)
        return (row[0], row[1]) if row else None

    def token_row(self, token_hash: str) -> Optional[Tuple[str, bool, str]]:
        """(name, admin, origin) of the token with this hash, or None."""
        row = self.conn.execute("SELECT name, admin, origin FROM tokens WHERE hash = ?", (token_hash,)).fetchone()
        return (row[0], bool(row[1]), str(row[2])) if row else None

    def token_list(self) -> List[Tuple[str, bool, str, str, float, Optional[float]]]:
        """(name, admin, origin, queue, created_at, last_used) of every named token, by name."""
        rows = self.conn.execute("SELECT name, admin, origin, queue, created_at, last_used FROM tokens ORDER BY name")
        return [
            (str(n), bool(a), str(o), str(q), float(c), None if u is None else float(u)) for n, a, o, q, c, u in rows
        ]

    def token_named(self, name: str) -> Optional[Tuple[bool, str, str]]:
        """(admin, origin, queue) of the token called `name`, or None."""
        row = self.conn.execute("SELECT admin, origin, queue FROM tokens WHERE name = ?", (name,)).fetchone()
        return (bool(row[0]), str(row[1]), str(row[2])) if row else None

    def token_last_used(self, token_hash: str) -> Optional[float]:
        row = self.conn.execute("SELECT last_used FROM tokens WHERE hash = ?", (token_hash,)).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def delete_token(self, name: str) -> bool:
        return self.conn.execute("DELETE FROM tokens WHERE name = ?", (name,)).rowcount > 0

    def touch_token(self, token_hash: str, now: float, every_s: float) -> None:
        """Record that the token authenticated at `now`, unless it did within `every_s`."""
        self.conn.execute(
            "UPDATE tokens SET last_used = ? WHERE hash = ? AND (last_used IS NULL OR last_used < ?)",
            (now, token_hash, now - every_s),
        )

    def legacy_tokens(self) -> List[str]:
        """Names of tokens with no recorded origin (made before schema 2)."""
        return [r[0] for r in self.conn.execute("SELECT name FROM tokens WHERE origin = 'legacy' ORDER BY name")]


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
    from ..core.suspension import Suspension  # lazily: most leases never suspend

    return Suspension.from_dict(json.loads(record))
