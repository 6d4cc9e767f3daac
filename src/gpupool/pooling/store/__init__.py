"""SQLite persistence of the pool (stdlib only): devices, leases, the FIFO queue, tokens.

WAL journal, one `BEGIN IMMEDIATE` transaction per state change, so several
processes on one state dir serialise their writes through SQLite alone.

Owns: the schema, `Store` (connections, transactions, checkpoints), `Tx` (typed queries, store/tx.py, composed of tx_base, tx_leases, tx_tickets, tx_history, tx_tokens),
`samples` (the pool over time, one row a minute, for the dashboard's long ranges), the state-dir lock. The token table is written through `server.auth`, never directly.
May import: core (floor 1: its own floor and core); the standard library only.
"""

from .db import DB_NAME, Store
from .lock import StateLock

__all__ = ["Store", "StateLock", "DB_NAME"]
