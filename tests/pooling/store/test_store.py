"""The SQLite store: schema, transactions, durability settings, the state-dir lock."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from waiting import wait_until

from gpupool.core.errors import StateLocked
from gpupool.core.model import Device, Holder, Lease, Slice
from gpupool.pooling.store import StateLock, Store


def _lease(lease_id: str, uuid: str = "G0", mib: int = 100) -> Lease:
    return Lease(lease_id, Holder("a", 1, "h"), (Slice(uuid, mib, 0), Slice("G1", 5, 1)), 30.0, 1.0, 31.0)


def test_pragmas_and_round_trip(tmp_path):
    store = Store(tmp_path)
    conn = store.connection()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    with store.write() as tx:
        tx.replace_devices([Device("G0", 0, "T4", 1000), Device("G1", 1, "T4", 1000)])
        tx.insert_lease(_lease("a"))
        tx.insert_lease(_lease("b", mib=50))
    with store.read() as tx:
        assert tx.allocated() == {"G0": 150, "G1": 10}
        assert tx.get_lease("a") == _lease("a")
        assert [x.id for x in tx.leases()] == ["a", "b"]
        assert tx.devices_generation() == 1
    store.close()
    reopened = Store(tmp_path, synchronous="FULL")
    assert reopened.connection().execute("PRAGMA synchronous").fetchone()[0] == 2
    with reopened.write() as tx:
        assert tx.delete_lease("a")
        assert not tx.delete_lease("a")
        assert tx.allocated() == {"G0": 50, "G1": 5}


def test_failed_transaction_rolls_back(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(RuntimeError), store.write() as tx:
        tx.insert_lease(_lease("a"))
        raise RuntimeError("boom")
    with store.read() as tx:
        assert tx.leases() == []


def test_tokens_store_only_hashes(tmp_path):
    store = Store(tmp_path)
    with store.write() as tx:
        tx.put_token("alice", "h1", False, 1.0)
        tx.put_token("alice", "h2", True, 2.0)  # rotation replaces
    with store.read() as tx:
        assert tx.token_by_hash("h1") is None
        assert tx.token_by_hash("h2") == ("alice", True)


def test_state_lock_is_exclusive_across_processes(tmp_path):
    with StateLock(tmp_path):
        code = textwrap.dedent(
            f"""
            from gpupool.pooling.store import StateLock
            from gpupool.core.errors import StateLocked
            try:
                StateLock({str(tmp_path)!r}).acquire()
            except StateLocked as err:
                print("LOCKED", err.message)
            """
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
        assert out.startswith("LOCKED") and str(tmp_path) in out
    # released: a new holder gets it
    StateLock(tmp_path).acquire().release()


def test_state_lock_in_one_process(tmp_path):
    first = StateLock(tmp_path).acquire()
    with pytest.raises(StateLocked):
        StateLock(tmp_path).acquire()
    first.release()


def test_processes_opening_a_fresh_state_dir_at_once_all_succeed(tmp_path):
    # Switching a new database to WAL fails at once with "database is locked" for all but
    # one of several processes doing it together; the store retries instead of failing.
    code = textwrap.dedent("""
        import sys, time
        from gpupool.pooling.store import Store
        start = float(sys.argv[2])
        while time.time() < start:
            pass
        Store(sys.argv[1]).close()
    """)
    import time

    for attempt in range(3):
        state = tmp_path / f"state{attempt}"
        start = time.time() + 0.5
        procs = [
            subprocess.Popen([sys.executable, "-c", code, str(state), str(start)], stderr=subprocess.PIPE, text=True)
            for _ in range(4)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err


def test_close_waits_for_a_transaction_in_another_thread(tmp_path):
    """Closing a connection another thread is inside would free memory SQLite still uses (a segfault)."""
    import threading
    import time

    from gpupool.pooling.store import Store

    store = Store(tmp_path)
    inside, closing = threading.Event(), threading.Event()
    seen: list = []
    queried: list = []

    main = threading.get_ident()

    def close_waits() -> bool:
        """The main thread is in Store.close, waiting for this transaction to end."""
        names, frame = [], sys._current_frames().get(main)
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        return "close" in names and "wait_for" in names

    def reader() -> None:
        with store.read() as tx:
            inside.set()
            closing.wait(60)
            wait_until(close_waits, 60, "close() in the main thread to wait for the reader")  # still inside then
            seen.append(tx.conn.execute("SELECT count(*) FROM leases").fetchone()[0])
            queried.append(time.monotonic())

    thread = threading.Thread(target=reader)
    thread.start()
    assert inside.wait(60)
    closing.set()
    store.close()
    closed = time.monotonic()
    thread.join(60)
    assert seen == [0], "the reader's query ran on an open connection"
    # an order, not a duration: close() returned only after the reader's query, inside its transaction
    assert queried and closed >= queried[0], "close() returned while the other thread was still inside its transaction"
