"""Opening a schema-2 database (before queues) migrates it in place, idempotently, keeping its rows."""

from __future__ import annotations

import sqlite3

from gpupool.core.model import Claim, Holder
from gpupool.core.queues import QueueSpec
from gpupool.pooling.pool import Pool
from gpupool.pooling.store import Store
from gpupool.pooling.store.db import DB_NAME
from gpupool.pooling.store.schema import SCHEMA_VERSION

# The tables of schema 2 as gpupool wrote them before queues (store/schema.py at that version).
SCHEMA_2 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE devices (uuid TEXT PRIMARY KEY, idx INTEGER NOT NULL, name TEXT NOT NULL,
    memory_mib INTEGER NOT NULL, node TEXT NOT NULL, healthy INTEGER NOT NULL DEFAULT 1);
CREATE TABLE leases (id TEXT PRIMARY KEY, holder_name TEXT NOT NULL, holder TEXT NOT NULL,
    ttl_s REAL NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL);
CREATE INDEX leases_by_expiry ON leases (expires_at);
CREATE TABLE slices (lease_id TEXT NOT NULL REFERENCES leases (id) ON DELETE CASCADE,
    device_uuid TEXT NOT NULL, memory_mib INTEGER NOT NULL, grp INTEGER NOT NULL);
CREATE INDEX slices_by_lease ON slices (lease_id);
CREATE INDEX slices_by_device ON slices (device_uuid, memory_mib);
CREATE TABLE tickets (id INTEGER PRIMARY KEY AUTOINCREMENT, claim TEXT NOT NULL, holder TEXT NOT NULL,
    host TEXT NOT NULL, pid INTEGER NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE tokens (name TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, admin INTEGER NOT NULL,
    created_at REAL NOT NULL, origin TEXT NOT NULL DEFAULT 'legacy');
INSERT INTO meta VALUES ('schema_version', '2');
INSERT INTO devices VALUES ('G0', 0, 'emu', 1000, 'n', 1), ('G1', 1, 'emu', 1000, 'n', 1);
INSERT INTO leases VALUES ('old', 'alice', '{"name": "alice", "pid": 1, "host": "h", "label": "job"}',
    3600, 100.0, 9e9);
INSERT INTO slices VALUES ('old', 'G0', 500, 0);
INSERT INTO tokens VALUES ('ci', 'abc', 0, 1.0, 'api');
"""


def _schema_2(tmp_path):
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.executescript(SCHEMA_2)
    conn.close()


def test_a_schema_2_database_is_migrated_and_keeps_its_rows(tmp_path):
    _schema_2(tmp_path)
    for _ in range(2):  # the second open finds nothing left to do
        store = Store(tmp_path)
        with store.read() as tx:
            assert tx.meta("schema_version") == str(SCHEMA_VERSION)
            (lease,) = tx.leases()
            assert lease.id == "old" and lease.queue == "" and lease.priority == 0 and lease.preempted_at is None
            assert tx.token_row("abc") == ("ci", False, "api") and tx.token_queue("abc") == ""
            assert tx.queue_specs() == []
        store.close()
    pool = Pool(tmp_path, node="n")
    try:
        pool.set_queue(QueueSpec("a", 1))
        lease = pool.claim(Claim.single(1, fraction=0.5, queue="a"), Holder("bob"))
        pool.release("old")
        pool.release(lease.id)
        rows = {r.key: r for r in pool.usage(since=0, by="label")}
        assert rows["job"].leases == 1 and rows["job"].gpu_seconds > 0
        assert {r.key for r in pool.usage(since=0)} == {"", "a"}
    finally:
        pool.close()


def test_history_rows_carry_the_lease_size_and_reason(tmp_path):
    store = Store(tmp_path)
    with store.write() as tx:
        tx.replace_devices([])
        tx.conn.execute("INSERT INTO devices VALUES ('G0', 0, 'emu', 1000, 'n', 1)")
        tx.put_token("t", "h1", False, 1.0, "api", queue="a")
        assert tx.token_queue("h1") == "a" and tx.token_queue("nope") == ""
    pool = Pool(tmp_path, node="n")
    try:
        lease = pool.claim(Claim.single(1, memory_mib=250), Holder("x", label="l"))
        pool.release(lease.id)
        row = pool.store.connection().execute("SELECT queue, holder_name, label, gpus, reason FROM lease_history")
        assert row.fetchall() == [("", "x", "l", 0.25, "released")]
    finally:
        pool.close()
        store.close()


def test_a_schema_4_database_gains_held_tickets_and_exit_codes(tmp_path):
    import re

    from gpupool.pooling.store.schema import SCHEMA

    # Schema 4: today's tables without the last column of tickets (held) and the last two of
    # lease_history (exit_code, and ended_by, which came later): their lines go, and the comma
    # that led to them.
    schema_4 = re.sub(r"\n\s*(held|exit_code|ended_by)\s[^\n]*", "", SCHEMA)
    schema_4 = re.sub(r",(\s*--[^\n]*)?((?:\n\s*--[^\n]*)*)\n\)", r"\1\2\n)", schema_4)
    assert "held" not in schema_4 and "exit_code" not in schema_4 and "ended_by" not in schema_4
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.executescript(schema_4)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '4')")
    conn.execute("INSERT INTO devices VALUES ('G0', 0, 'emu', 1000, 'n', 1)")
    conn.execute(
        "INSERT INTO lease_history (lease_id, queue, holder_name, label, gpus, started_at, ended_at, reason) "
        "VALUES ('old', '', 'alice', '', 0.5, 1.0, 2.0, 'released')"
    )
    conn.commit()
    conn.close()
    pool = Pool(tmp_path, node="n")
    try:
        (old,) = pool.history(0)
        assert old.lease_id == "old" and old.exit_code is None
        with pool.store.read() as tx:
            assert tx.meta("schema_version") == str(SCHEMA_VERSION)
        lease = pool.claim(Claim.single(1, fraction=1.0), Holder("bob"))
        waiter = pool.claims.begin(Claim.single(1, fraction=1.0), Holder("bob"), wait_s=30)
        assert pool.hold(waiter.ticket).held  # type: ignore[union-attr]
        pool.release(lease.id, exit_code=5)
        assert {r.lease_id: r.exit_code for r in pool.history(0)} == {"old": None, lease.id: 5}
        # Who ended a lease: not recorded for the old row, an admin for this release.
        assert {r.lease_id: r.ended_by for r in pool.history(0)} == {"old": "", lease.id: "admin"}
    finally:
        pool.close()
