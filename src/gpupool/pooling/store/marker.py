"""The state dir's `pool.id`: proof that a pool lived there, so a lost `pool.db` is never a fresh start.

SQLite opens a missing or zero-length file as an empty database, and the schema would then make
an empty pool of it: every lease and token gone without a word. So the first open of a database
writes `STATE/pool.id` (the pool's id, also kept in its meta table), and every later open of a
state dir that has one refuses a missing or empty `pool.db` with StateUnusable (exit 7) and the
fix. A fresh state dir has neither file and starts as before. Stdlib only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import StateUnusable
from .private import STATE_FILE_MODE

if TYPE_CHECKING:
    from typing import Optional

MARKER_NAME = "pool.id"
POOL_ID_KEY = "pool_id"  # the same id, in the database's meta table


def new_pool_id() -> str:
    """A random id for a new pool (os.urandom: uuid costs an import at every `gpupool run`)."""
    return os.urandom(16).hex()


def read_marker(state_dir: Path) -> Optional[str]:
    """The pool id recorded in `state_dir`, or None when no pool was ever created there."""
    try:
        return (state_dir / MARKER_NAME).read_text(encoding="utf-8").strip() or "?"
    except FileNotFoundError:
        return None


def write_marker(state_dir: Path, pool_id: str) -> None:
    """Record `pool_id` atomically: a reader sees the whole id or no file, never a part."""
    partial = state_dir / f"{MARKER_NAME}.{os.getpid()}.partial"  # racing processes write their own
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, STATE_FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(pool_id + "\n")
    os.replace(partial, state_dir / MARKER_NAME)


def lost_problem(db: Path) -> Optional[str]:
    """Why `db` cannot be the pool its state dir held (missing or empty while pool.id exists), or None.

    A database with any byte in it is SQLite's to judge; a zero-length one is also what a fresh
    database is for an instant while another process creates it, but pool.id is written only
    after that creation committed, so the two never meet.
    """
    try:
        if db.stat().st_size > 0:
            return None
        what = "empty (0 bytes)"
    except FileNotFoundError:
        what = "missing"
    pool_id = read_marker(db.parent)
    if pool_id is None:
        return None
    return f"{what}, but {db.parent / MARKER_NAME} says this state dir held pool {pool_id}"


def lost_message(db: Path, problem: str) -> str:
    """The one line of a lost database: the file, what is wrong, how to recover."""
    state = db.parent
    return (
        f"the pool database {db} is {problem}: its leases and tokens are not there. Restore the last backup with "
        f"`gpupool restore --state {state} BACKUP.db` (`gpupool doctor --state {state}` says more); to start an "
        f"empty pool on purpose, remove {state / MARKER_NAME}"
    )


def refuse_lost(db: Path) -> None:
    """Raise StateUnusable when `db` is missing or empty in a state dir that held a pool."""
    problem = lost_problem(db)
    if problem is not None:
        raise StateUnusable(lost_message(db, problem))
