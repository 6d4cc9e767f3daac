"""The base of `Tx` (store/tx.py): the connection inside a transaction, the meta rows and the devices."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from ...core.model import Device

if TYPE_CHECKING:
    from typing import List, Optional, Sequence


class TxBase:
    """Queries on a connection that is inside a transaction opened by `Store`: meta and devices."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        # The leases whose runner may have a step to take after this transaction (ended, preempted,
        # their suspension record written): the store tells its `on_commit` once it commits.
        self.changed: List[str] = []

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
