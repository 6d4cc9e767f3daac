"""Operator's tools on a state dir's database: SQLite's integrity check, online backup and restore.

All three work on the file itself (no `Store`: that would write the schema to a database that
may be damaged). The backup uses SQLite's online backup API, so it is a consistent copy even
while a server or embedded clients write; restore copies a backup in the same way, after
checking it, with the state dir locked so no server serves it meanwhile.
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import InvalidInput, StateUnusable
from .db import DB_NAME, damaged_message
from .lock import StateLock
from .marker import POOL_ID_KEY, write_marker
from .private import create_database

if TYPE_CHECKING:
    from typing import List, Tuple, Union

    PathLike = Union[str, Path]


def processes_using(state: Path) -> List[Tuple[int, str]]:
    """(pid, command) of the other processes that have the state dir's database open, as /proc shows
    them (a pool's clients keep it open while they hold leases); processes of other users whose
    fds this user may not read are not seen."""
    names = {str((state / DB_NAME).resolve()) + suffix for suffix in ("", "-wal", "-shm")}
    found: List[Tuple[int, str]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in names for fd in fds):
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append((int(entry), command[:80] or "?"))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def integrity(db: PathLike) -> List[str]:
    """SQLite's `PRAGMA integrity_check` of `db`: [] when it is sound, else what is wrong (one line each)."""
    path = Path(db)
    if not path.is_file():
        return [f"{path} does not exist"]
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            rows = [str(r[0]) for r in conn.execute("PRAGMA integrity_check(20)")]
    except sqlite3.DatabaseError as err:
        return [str(err)]
    return [] if rows == ["ok"] else rows


def backup(state_dir: PathLike, dest: PathLike) -> Path:
    """Copy the state dir's pool.db to `dest` with SQLite's online backup (safe while it is in use)."""
    source = Path(state_dir).expanduser() / DB_NAME
    target = Path(dest).expanduser()
    if not source.is_file():
        raise InvalidInput(f"{source} does not exist: give the --state DIR of a pool")
    if target.exists():
        raise InvalidInput(f"{target} exists already: give a new file name, or remove it first")
    problems = integrity(source)
    if problems:
        raise StateUnusable(damaged_message(source, "; ".join(problems[:3])))
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    create_database(partial)  # 0600, as the database it copies: token hashes, holders, labels
    try:
        with closing(sqlite3.connect(str(source))) as src, closing(sqlite3.connect(str(partial))) as dst:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
        os.replace(partial, target)
    except sqlite3.DatabaseError as err:
        partial.unlink(missing_ok=True)
        raise StateUnusable(damaged_message(source, str(err))) from None
    return target


def restore(state_dir: PathLike, backup_file: PathLike) -> Path:
    """Replace the state dir's pool.db with `backup_file` (checked first); the old one is moved aside.

    Returns where the old database went (pool.db.before-restore-<time>). Refused while a server
    holds the state dir (StateLocked) or any other process has its database open (embedded runs
    holding leases): InvalidInput names them.
    """
    state = Path(state_dir).expanduser()
    source = Path(backup_file).expanduser()
    problems = integrity(source)
    if problems:
        raise InvalidInput(f"{source} is not a sound gpupool backup ({'; '.join(problems[:3])}): pick another")
    with closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True)) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not {"meta", "devices", "leases", "slices", "tokens"} <= tables:
        raise InvalidInput(f"{source} is an SQLite file but not a gpupool pool database: pick a `gpupool backup` file")
    state.mkdir(parents=True, exist_ok=True)
    with StateLock(state, "stop the server first, then restore"):
        users = processes_using(state)
        if users:
            shown = ", ".join(f"{pid} ({command})" for pid, command in users[:3])
            more = f" and {len(users) - 3} more" if len(users) > 3 else ""
            raise InvalidInput(
                f"{state / DB_NAME} is open in process(es) {shown}{more}: a `gpupool run` or other client of this "
                "pool would lose its lease; let them end (or stop them) and restore again"
            )
        db = state / DB_NAME
        aside = state / f"{DB_NAME}.before-restore-{time.strftime('%Y%m%d-%H%M%S')}"
        if db.exists():
            os.replace(db, aside)
        for suffix in ("-wal", "-shm"):  # they belong to the old file; SQLite must not replay them
            extra = state / (DB_NAME + suffix)
            if extra.exists():
                os.replace(extra, Path(str(aside) + suffix))
        partial = state / (DB_NAME + ".restoring")
        with (
            closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True)) as src,
            closing(sqlite3.connect(str(partial))) as dst,
        ):
            src.backup(dst)
            row = dst.execute("SELECT value FROM meta WHERE key = ?", (POOL_ID_KEY,)).fetchone()
        os.replace(partial, db)
        if row is not None:  # pool.id names the pool the state dir holds now (a backup of another pool's)
            write_marker(state, str(row[0]))
    return aside
