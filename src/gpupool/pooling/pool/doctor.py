"""`check_state(state_dir)`: the pool's invariants and SQLite's integrity check, as one verdict.

What `gpupool doctor` prints and the server runs at start (a damaged database stops it; other
problems are logged). The rows are read with a connection of its own, read-only, row by row,
so a damaged row is a finding rather than an exception.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import InvalidInput
from ...core.invariants import Problem, pool_problems
from ...core.model import Device, Holder, Lease, Slice
from ...core.queues import QueueSpec, check_quotas_fit
from ...core.suspension import Suspension
from ..store import DB_NAME
from ..store.maintenance import integrity
from ..store.marker import lost_message, lost_problem

if TYPE_CHECKING:
    from typing import Any, Dict, List, Tuple, Union


@dataclass
class Report:
    """What the check found: `problems` (empty when healthy) and what it looked at."""

    db: str
    problems: List[Problem] = field(default_factory=list)
    leases: int = 0
    devices: int = 0
    tickets: int = 0

    @property
    def healthy(self) -> bool:
        return not self.problems

    @property
    def damaged(self) -> bool:
        """SQLite itself found the file unsound (not only a broken invariant)."""
        return any(p.kind == "integrity" for p in self.problems)

    def verdict(self) -> str:
        """One line: healthy, or how many problems (listed by `lines`)."""
        seen = f"{self.devices} GPU(s), {self.leases} lease(s), {self.tickets} queued claim(s)"
        if self.healthy:
            return f"{self.db}: healthy ({seen}; SQLite integrity ok)"
        return f"{self.db}: {len(self.problems)} problem(s) ({seen})"

    def lines(self) -> List[str]:
        return [f"{p.kind}: {p.message}" for p in self.problems]

    def to_dict(self) -> Dict[str, Any]:
        return {
            "db": self.db,
            "healthy": self.healthy,
            "verdict": self.verdict(),
            "problems": [p.to_dict() for p in self.problems],
            "devices": self.devices,
            "leases": self.leases,
            "tickets": self.tickets,
        }


def check_state(state_dir: Union[str, Path]) -> Report:
    """Check the pool database of `state_dir` (nothing is written)."""
    db = Path(state_dir).expanduser() / DB_NAME
    report = Report(str(db))
    lost = lost_problem(db)  # before SQLite, which reads a lost file as an empty, healthy pool
    if lost is not None:
        report.problems = [Problem("integrity", lost_message(db, lost))]
        return report
    damage = integrity(db)
    if damage:
        report.problems = [Problem("integrity", f"SQLite: {line}") for line in damage]
        return report
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            _check_rows(conn, report)
    except sqlite3.DatabaseError as err:
        report.problems.append(Problem("integrity", f"SQLite: {err}"))
    return report


def _suspension_records(conn: sqlite3.Connection) -> Dict[str, str]:
    """lease id -> its suspension record (JSON); none in a database from before suspensions."""
    known = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'suspensions'").fetchone()
    if known is None:
        return {}
    return {str(lease_id): str(record) for lease_id, record in conn.execute("SELECT lease_id, record FROM suspensions")}


def _check_rows(conn: sqlite3.Connection, report: Report) -> None:
    conn.execute("BEGIN")  # one snapshot for every table
    devices: List[Device] = []
    for row in conn.execute("SELECT uuid, idx, name, memory_mib, node, healthy FROM devices ORDER BY node, idx"):
        uuid, idx, name, memory, node, healthy = row
        if not (isinstance(memory, int) and memory > 0 and isinstance(idx, int)):
            report.problems.append(Problem("bad_device", f"device {uuid!r}: index {idx!r}, memory {memory!r} MiB"))
            continue
        devices.append(Device(str(uuid), idx, str(name), memory, str(node), bool(healthy)))
    slices: Dict[str, List[Slice]] = {}
    for lease_id, uuid, mib, grp in conn.execute("SELECT lease_id, device_uuid, memory_mib, grp FROM slices"):
        if not isinstance(mib, int) or not isinstance(grp, int):
            report.problems.append(Problem("bad_slice", f"lease {lease_id}: a slice of {mib!r} MiB on {uuid}"))
            continue
        slices.setdefault(str(lease_id), []).append(Slice(str(uuid), mib, grp))
    suspensions = _suspension_records(conn)
    leases: List[Lease] = []
    for lease_id, holder, ttl_s, created_at, expires_at in conn.execute(
        "SELECT id, holder, ttl_s, created_at, expires_at FROM leases"
    ):
        try:
            parsed = Holder.from_dict(json.loads(holder))
            record = suspensions.get(str(lease_id))
            leases.append(
                Lease(
                    lease_id,
                    parsed,
                    tuple(slices.pop(lease_id, [])),
                    float(ttl_s),
                    float(created_at),
                    float(expires_at),
                    suspension=None if record is None else Suspension.from_dict(json.loads(record)),
                )
            )
        except Exception as err:  # a damaged row of any kind is a finding
            slices.pop(lease_id, None)
            report.problems.append(Problem("bad_lease", f"lease {lease_id}: its row does not parse ({err})"))
    for lease_id, orphans in slices.items():
        mib = sum(s.memory_mib for s in orphans)
        report.problems.append(
            Problem("orphan_slices", f"{len(orphans)} slice(s) of {mib} MiB belong to lease {lease_id}, which is gone")
        )
    allocated = {
        str(uuid): int(total)
        for uuid, total in conn.execute("SELECT device_uuid, SUM(memory_mib) FROM slices GROUP BY device_uuid")
        if isinstance(total, int)
    }
    tickets: List[Tuple[Any, ...]] = conn.execute(
        "SELECT id, claim, holder, host, pid, created_at, expires_at FROM tickets ORDER BY id"
    ).fetchall()
    _check_queues(conn, devices, report)
    conn.execute("COMMIT")
    report.problems.extend(pool_problems(devices, leases, allocated, tickets))
    report.devices, report.leases, report.tickets = len(devices), len(leases), len(tickets)


def _check_queues(conn: sqlite3.Connection, devices: List[Device], report: Report) -> None:
    """Queue rows that do not parse, and quotas that add up to more GPUs than the pool has now
    (set_queue refuses that, but GPUs may have gone since)."""
    try:
        rows = conn.execute("SELECT name, quota, weight, limit_gpus FROM queues ORDER BY name").fetchall()
    except sqlite3.OperationalError:  # a database from before queues, not migrated yet: none to check
        return
    specs: List[QueueSpec] = []
    for name, quota, weight, limit in rows:
        try:
            specs.append(QueueSpec(name, quota, weight, limit))
        except InvalidInput as err:
            report.problems.append(Problem("bad_queue", err.message))
    try:
        check_quotas_fit(specs, float(len(devices)))
    except InvalidInput as err:
        report.problems.append(Problem("quotas_over_pool", err.message))
