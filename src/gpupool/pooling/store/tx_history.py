"""The queues' definitions and the lease history, inside one transaction (a part of `Tx`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.suspension import BY_OWNER, RESUMING, SUSPENDED
from .tx_leases import LeaseTx

if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

    from ...core.queues import QueueSpec

# How many of the newest history rows `Tx.how_ended` reads: a lease whose runner still watches it
# ended moments ago, so it is among them; an older or unknown id costs no scan of the whole history.
ENDED_LOOKBACK = 10000


class HistoryTx(LeaseTx):
    """Queues and the history of ended leases (usage accounting, how a lease ended)."""

    # --- queues ---------------------------------------------------------------
    def queue_specs(self) -> List[QueueSpec]:
        rows = self.conn.execute(
            "SELECT name, quota, weight, limit_gpus, preempt, idle_suspend_s, default_time_s, max_time_s "
            "FROM queues ORDER BY name"
        ).fetchall()
        if not rows:  # the common pool has no queues: core.queues (and placement under it) stays unloaded
            return []
        from ...core.queues import QueueSpec

        return [QueueSpec(*row) for row in rows]

    def put_queue(self, spec: QueueSpec) -> None:
        self.conn.execute(
            "INSERT INTO queues (name, quota, weight, limit_gpus, preempt, idle_suspend_s, default_time_s, max_time_s) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET quota = excluded.quota, weight = excluded.weight, "
            "limit_gpus = excluded.limit_gpus, preempt = excluded.preempt, idle_suspend_s = excluded.idle_suspend_s, "
            "default_time_s = excluded.default_time_s, max_time_s = excluded.max_time_s",
            (
                spec.name,
                spec.quota,
                spec.weight,
                spec.limit,
                spec.preempt,
                spec.idle_suspend_s,
                spec.default_time_s,
                spec.max_time_s,
            ),
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
