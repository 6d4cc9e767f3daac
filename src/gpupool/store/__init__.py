"""SQLite persistence of the pool (stdlib only): devices, leases, the FIFO queue, tokens.

WAL journal, one `BEGIN IMMEDIATE` transaction per state change, so several
processes on one state dir serialise their writes through SQLite alone.
"""

from .db import Store, DB_NAME
from .lock import StateLock

__all__ = ["Store", "StateLock", "DB_NAME"]
