"""The tickets of waiting claims (the queue), inside one transaction (a part of `Tx`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .tx_base import TxBase

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple


class TicketTx(TxBase):
    """Tickets: take, refresh, hold, reprioritize, list, drop."""

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
