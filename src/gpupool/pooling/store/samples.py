"""The pool's samples over time on disk: memory allocated and used, leases and queue length.

What the dashboard draws for ranges longer than the hour a server keeps in
memory (server/dashboard/history.py). The server's sampler writes at most one
row per minute (the minute is the key: a second write in it, by a restart or a
second server on the state dir, is ignored), each write drops the rows older
than the retention, so the table stays near 7 x 1,440 rows; a read averages
the rows into the chart's buckets in SQL, so 7 days cost one indexed range
scan and `buckets` rows back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import List, Optional

    from .tx import Tx

PERIOD_S = 60  # one row per minute at most
RETENTION_S = 7 * 86400  # the dashboard's longest range


class Sample(NamedTuple):
    """The pool at one time: its memory, allocated and used (None: usage not sampled), leases and
    queue length (whole numbers when written, a bucket's means when read)."""

    at: float
    total_mib: int
    allocated_mib: int
    used_mib: Optional[int]
    leases: float
    queued: float


def minute_of(at: float) -> int:
    """The key of the row `at` falls in: the start of its minute."""
    return int(at // PERIOD_S) * PERIOD_S


def write(tx: Tx, sample: Sample, retention_s: float = RETENTION_S) -> bool:
    """Keep `sample` as its minute's row unless the minute has one; drop rows older than
    `retention_s` before it. True when it was written."""
    minute = minute_of(sample.at)
    written = tx.conn.execute(
        "INSERT OR IGNORE INTO samples (minute, at, total_mib, allocated_mib, used_mib, leases, queued) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (minute, *sample),
    ).rowcount
    if written:
        tx.conn.execute("DELETE FROM samples WHERE minute < ?", (minute - retention_s,))
    return bool(written)


def read(tx: Tx, since: float, until: float, buckets: int) -> List[Sample]:
    """The samples of [since, until] averaged over `buckets` equal buckets, oldest first; each at
    the time of its bucket's last sample, empty buckets left out. A bucket's `used_mib` is the
    mean of the samples that had one (None where none had)."""
    width = (until - since) / max(1, buckets)
    if width <= 0:
        return []
    rows = tx.conn.execute(
        "SELECT MAX(at), AVG(total_mib), AVG(allocated_mib), AVG(used_mib), AVG(leases), AVG(queued) "
        "FROM samples WHERE minute >= ? AND minute <= ? "
        "GROUP BY CAST((minute - ?) / ? AS INTEGER) ORDER BY 1",
        (minute_of(since), until, since, width),
    ).fetchall()
    return [
        Sample(at, round(total), round(allocated), None if used is None else round(used), leases, queued)
        for at, total, allocated, used, leases, queued in rows
        if since <= at <= until
    ]


def count(tx: Tx) -> int:
    """How many rows the table holds."""
    return int(tx.conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0])
