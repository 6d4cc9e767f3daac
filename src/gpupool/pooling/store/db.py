"""The SQLite database of one state dir: connections, pragmas and transactions.

Durability: WAL with synchronous=NORMAL by default. A commit has been written
(write(2)) to the WAL before COMMIT returns, so a kill -9 of the process - the
crash the pool must survive - never loses an acknowledged lease; only an OS
crash or power cut can lose the last commits (never corrupt the file). Pass
synchronous="FULL" (env GPUPOOL_SYNC=full) to fsync every commit as well, at
the price of one fsync per claim and per release.

Checkpoints: SQLite copies the WAL back into the database (and fsyncs both,
flushing every WAL page written since the last one) in whichever commit
crosses 1,000 WAL pages - every ~80 claims with 4 KiB pages. That took
7-25 ms, inside a request. So new databases use 1 KiB pages (a quarter of
the bytes per commit), and a long-lived process (the server) passes
`background_checkpoint=True`: its connections never checkpoint, and a thread
of its own does every `CHECKPOINT_PERIOD_S`, holding writers only briefly and
only when the WAL has grown past `WAL_RESTART_BYTES` (see `_checkpoint`).
"""

from __future__ import annotations

import binascii
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import InvalidInput, StateUnusable
from ...logs import get_logger
from .marker import MARKER_NAME, POOL_ID_KEY, new_pool_id, refuse_lost, write_marker
from .private import create_database, make_private
from .schema import ADDED_COLUMNS, SCHEMA, SCHEMA_VERSION
from .tx import Tx

if TYPE_CHECKING:
    from typing import Callable, Iterator, List, Optional, Sequence, Union

log = get_logger(__name__)

DB_NAME = "pool.db"
SYNC_ENV = "GPUPOOL_SYNC"
CHECKPOINT_PERIOD_S = 0.25
WAL_RESTART_BYTES = 64 << 20
PAGE_SIZE = 1024
# close() waits this long for transactions of other threads before closing their connections anyway.
CLOSE_WAIT_S = 5.0
# PRAGMA user_version of a database whose schema is exactly this one: a CRC of the schema text, its
# version and the added columns (never 0, a new database's). Any change to them changes it, and the
# next open runs the whole creation and migration again.
SCHEMA_FINGERPRINT = binascii.crc32(f"{SCHEMA_VERSION}\n{SCHEMA}\n{ADDED_COLUMNS!r}".encode()) & 0x7FFFFFFF or 1


def damaged_message(path: Path, what: str) -> str:
    """The one line of a damaged database: the file, what is wrong, how to recover."""
    state = path.parent
    return (
        f"the pool database {path} is damaged ({what}): restore the last backup with "
        f"`gpupool restore --state {state} BACKUP.db`, or move {path.name} and {MARKER_NAME} aside to start an empty pool "
        f"(its leases and tokens are lost); `gpupool doctor --state {state}` says more"
    )


def read_only_message(state_dir: Path) -> str:
    """The one line of a state dir this process may not write."""
    return (
        f"the state dir {state_dir} is read-only for this user: the pool writes pool.db there; "
        "give a writable --state DIR (or $GPUPOOL_STATE), or fix its permissions"
    )


class Store:
    """The pool database under `state_dir`; one SQLite connection per thread and process.

    Use `with store.write() as tx:` for every state change (BEGIN IMMEDIATE:
    the write lock is taken up front, so the read-then-write of a placement
    cannot race another process) and `with store.read() as tx:` for snapshots.
    """

    def __init__(
        self,
        state_dir: Union[str, Path],
        synchronous: Optional[str] = None,
        busy_timeout_s: float = 30.0,
        background_checkpoint: bool = False,
    ) -> None:
        self.state_dir = Path(state_dir)
        make_private(self.state_dir)  # holders, labels, usage and token hashes: its owner's only
        self.path = self.state_dir / DB_NAME
        if not os.access(self.state_dir, os.W_OK):
            raise StateUnusable(read_only_message(self.state_dir))
        sync = (synchronous or os.environ.get(SYNC_ENV) or "NORMAL").upper()
        if sync not in ("NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous={sync!r}: use NORMAL or FULL")
        self.synchronous = sync
        self.busy_timeout_s = busy_timeout_s
        self._background_checkpoint = background_checkpoint
        self._local = threading.local()
        self._all: List[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        # Transactions in flight, so close() never frees a connection another thread is inside
        # (SQLite would use freed memory: a segfault, not an exception).
        self._busy = 0
        self._idle = threading.Condition(self._all_lock)
        # Writers of this process queue here rather than in SQLite's busy handler, which
        # sleeps in steps of up to 100 ms: that made the tail latency under load.
        self._write_lock = threading.Lock()
        # Told the leases a write transaction changed (Tx.changed), after its commit: the pool's
        # notification path (pool/notify.py), which wakes their watches in this process.
        self.on_commit: Optional[Callable[[Sequence[str]], None]] = None
        self._checkpointer: Optional[threading.Thread] = None
        self._stop = threading.Event()
        # Before SQLite sees the file: it would make an empty pool of a lost one (store.marker).
        refuse_lost(self.path)
        create_database(self.path)  # 0600 before SQLite creates it (0644 under the usual umask)
        try:
            self._init_schema()
            self._ensure_marker()
        except (sqlite3.Error, UnicodeEncodeError) as err:
            self.close()
            raise self._explained(err) from None
        except BaseException:
            self.close()
            raise
        if background_checkpoint:
            self._start_checkpointer()

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions, we issue BEGIN ourselves.
        # check_same_thread=False only so close() may close other threads' connections.
        conn = sqlite3.connect(
            str(self.path), timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        # Only takes effect when this creates the database: every commit writes each page it
        # touched (about six per claim) to the WAL, and checkpoints flush them to disk, so
        # small pages are less to write and to flush; the rows are small.
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        self._wal_mode(conn)
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        if self._background_checkpoint:
            conn.execute("PRAGMA wal_autocheckpoint=0")
        with self._all_lock:
            self._all.append(conn)
        return conn

    def _wal_mode(self, conn: sqlite3.Connection) -> None:
        """PRAGMA journal_mode=WAL, retried while another process holds the lock it needs.

        Two processes opening a fresh state dir at once (two `gpupool run`s) race to
        switch it to WAL, and SQLite answers "database is locked" at once, without
        its busy handler; the loser waits here for the winner instead of failing.
        """
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.001
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _start_checkpointer(self) -> None:
        conn = self._connect()  # its own connection, used by that thread alone
        wal = str(self.path) + "-wal"
        frame_bytes = int(conn.execute("PRAGMA page_size").fetchone()[0]) + 24

        def run() -> None:
            while not self._stop.wait(CHECKPOINT_PERIOD_S):
                try:
                    self._checkpoint(conn, wal, frame_bytes)
                except sqlite3.Error as err:  # closed under us at shutdown, or a busy reader
                    if self._stop.is_set():
                        return
                    log.debug("checkpoint failed: %s", err)

        self._checkpointer = threading.Thread(target=run, name="gpupool-checkpoint", daemon=True)
        self._checkpointer.start()

    def _checkpoint(self, conn: sqlite3.Connection, wal: str, frame_bytes: int) -> None:
        """Copy the WAL into the database, and now and then let the WAL start over.

        A checkpoint fsyncs the WAL, copies its pages, fsyncs the database. A PASSIVE
        one takes no lock that writers wait for, so it runs every period; but the WAL
        only starts over (instead of growing) after a checkpoint that covered every
        frame, which under steady writes means holding this process's writers. That
        is done only once the WAL holds `WAL_RESTART_BYTES`, and never for the slow
        part: the unlocked checkpoint synced the bulk, an fdatasync of the WAL flushes
        the frames written meanwhile, and the last checkpoint, with the writers held,
        has little left to copy or sync. (A descriptor of the -wal file is safe to
        open and close: SQLite's POSIX locks are on the database and -shm files.)
        """
        _busy, frames, _done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if frames * frame_bytes < WAL_RESTART_BYTES:
            return
        try:
            fd = os.open(wal, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
        with self._write_lock:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (a fresh one after fork: SQLite handles must not cross it)."""
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            conn = self._connect()
            local.conn, local.pid = conn, os.getpid()
        return conn

    def _init_schema(self) -> None:
        # A database that this very schema created or migrated says so in its header: nothing to
        # create, add or check then (one read instead of a write transaction of ~16 statements,
        # at every `gpupool run` on the embedded pool).
        if self.connection().execute("PRAGMA user_version").fetchone()[0] == SCHEMA_FINGERPRINT:
            return
        with self.write() as tx:
            # executescript() would COMMIT our transaction, so run statement by statement.
            statement = ""
            for line in SCHEMA.splitlines(keepends=True):
                statement += line
                if sqlite3.complete_statement(statement):
                    tx.conn.execute(statement)
                    statement = ""
            version = tx.meta("schema_version")
            if version is not None and int(version) > SCHEMA_VERSION:
                raise StateUnusable(
                    f"state dir {self.state_dir} was written by a newer gpupool (schema {version}); upgrade gpupool"
                )
            # Schema 1's tokens get origin 'legacy' (not honoured with auth on); schema 2's leases,
            # tickets and tokens no queue.
            for table, added in ADDED_COLUMNS.items():
                columns = {row[1] for row in tx.conn.execute(f"PRAGMA table_info({table})")}
                for column, declaration in added:
                    if column not in columns:
                        tx.conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            if version is None or int(version) < SCHEMA_VERSION:
                tx.set_meta("schema_version", str(SCHEMA_VERSION))
            tx.conn.execute(f"PRAGMA user_version={SCHEMA_FINGERPRINT}")

    def _ensure_marker(self) -> None:
        """Write STATE/pool.id once the database exists (a state dir of an older gpupool gets one
        at its next open); later opens only find it."""
        if (self.state_dir / MARKER_NAME).exists():
            return
        with self.write() as tx:
            pool_id = tx.meta(POOL_ID_KEY)
            if pool_id is None:
                pool_id = new_pool_id()
                tx.set_meta(POOL_ID_KEY, pool_id)
        write_marker(self.state_dir, pool_id)

    @contextmanager
    def write(self) -> Iterator[Tx]:
        """One state change: BEGIN IMMEDIATE ... COMMIT, rolled back on any exception.

        A damaged, read-only or full database raises StateUnusable, text SQLite cannot
        store (lone surrogates) InvalidInput: one line for the user, never sqlite3's own.
        """
        try:
            with self._in_flight():
                conn = self.connection()
                with self._write_lock:
                    conn.execute("BEGIN IMMEDIATE")
                    tx = Tx(conn)
                    try:
                        yield tx
                    except BaseException:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
                        raise
                    try:
                        conn.execute("COMMIT")
                    except sqlite3.Error:
                        if conn.in_transaction:  # a failed COMMIT (disk full) leaves it open
                            conn.execute("ROLLBACK")
                        raise
                    self._local.commits = getattr(self._local, "commits", 0) + 1
        except (sqlite3.Error, UnicodeEncodeError) as err:
            raise self._explained(err) from None
        if tx.changed and self.on_commit is not None:
            self.on_commit(tx.changed)

    def _explained(self, err: BaseException) -> BaseException:
        """The GpupoolError a database error means for the user, or `err` itself when it means none."""
        if isinstance(err, UnicodeEncodeError):
            return InvalidInput(f"text with a lone surrogate cannot be stored ({err.reason}): send valid Unicode")
        text = str(err).lower()
        if any(word in text for word in ("malformed", "not a database", "encrypted", "disk image")):
            return StateUnusable(damaged_message(self.path, str(err)))
        if "readonly" in text or "read-only" in text or "unable to open" in text:
            return StateUnusable(read_only_message(self.state_dir))
        if "disk is full" in text or "disk i/o" in text:
            return StateUnusable(f"{self.path}: {err}: free space on its file system, or check the disk")
        return err

    def commits(self) -> int:
        """Write transactions committed on this thread's connection: a cache of what the
        database holds, kept up to date by its own writes, checks this (with PRAGMA
        data_version for other connections) to notice writes it did not see."""
        return getattr(self._local, "commits", 0)

    @contextmanager
    def read(self) -> Iterator[Tx]:
        """A consistent snapshot for reads (WAL readers never block the writer)."""
        try:
            with self._in_flight():
                conn = self.connection()
                conn.execute("BEGIN")
                try:
                    yield Tx(conn)
                finally:
                    if conn.in_transaction:
                        conn.execute("COMMIT")
        except sqlite3.DatabaseError as err:
            raise self._explained(err) from None

    def close(self) -> None:
        """Close every connection this store opened, in every thread."""
        self._stop.set()
        if self._checkpointer is not None:
            self._checkpointer.join(5.0)
            self._checkpointer = None
        with self._idle:
            # A reader in another thread (a dashboard poll, a scrape) finishes first; new ones
            # wait for the lock and then open fresh connections of their own.
            if not self._idle.wait_for(lambda: self._busy == 0, timeout=CLOSE_WAIT_S):
                log.warning("closing %s with %d transaction(s) still running", self.path, self._busy)
            conns, self._all = self._all, []
            self._local = threading.local()
            for conn in conns:
                try:
                    conn.close()
                except sqlite3.Error:  # pragma: no cover
                    log.debug("close failed", exc_info=True)

    @contextmanager
    def _in_flight(self) -> Iterator[None]:
        """Count a transaction while it runs (close() waits for the count to reach 0)."""
        with self._idle:
            self._busy += 1
        try:
            yield
        finally:
            with self._idle:
                self._busy -= 1
                if self._busy == 0:
                    self._idle.notify_all()
