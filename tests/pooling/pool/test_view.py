"""The per-connection view of the pool: it must follow every write it did not make itself."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest
from clock import FakeClock
from waiting import wait_until

from gpupool.core.errors import Forbidden, Unavailable
from gpupool.core.model import Claim, Holder, Lease, Slice
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool


def most() -> Claim:
    return Claim.single(1, fraction=0.75)


@pytest.fixture
def pools(tmp_path):
    clock = FakeClock()
    a = Pool(tmp_path, devices=emulated_devices("emulated:1x16GiB", "n"), node="n", clock=clock)
    b = Pool(tmp_path, clock=clock)  # another connection on the same state dir
    yield a, b, clock
    a.close()
    b.close()


def test_writes_of_another_connection_are_seen(pools):
    a, b, _ = pools
    b.release(b.claim(most(), Holder("b")).id)  # b's view is warm and says the GPU is free
    lease = a.claim(most(), Holder("a"))
    with pytest.raises(Unavailable):
        b.claim(most(), Holder("b"))
    b.release(lease.id)  # admin release through b
    a.release(a.claim(most(), Holder("a")).id)


def test_writes_of_another_process_are_seen(pools, tmp_path):
    a, _, _ = pools
    a.release(a.claim(most(), Holder("a")).id)
    code = textwrap.dedent(f"""
        from gpupool.core.model import Claim, Holder
        from gpupool.pooling.pool import Pool
        pool = Pool({str(tmp_path)!r})
        print(pool.claim(Claim.single(1, fraction=0.75), Holder("p"), ttl_s=600).id)
    """)
    lease_id = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    with pytest.raises(Unavailable):
        a.claim(most(), Holder("a"))
    a.release(lease_id)
    a.claim(most(), Holder("a"))


def test_direct_store_writes_on_the_same_connection_are_seen(pools):
    a, _, clock = pools
    a.release(a.claim(most(), Holder("a")).id)
    uuid = a.devices()[0].uuid
    with a.store.write() as tx:  # not through the pool: the view did not follow it
        tx.insert_lease(Lease("x", Holder("x"), (Slice(uuid, 15000, 0),), 60.0, clock.now, clock.now + 60))
    with pytest.raises(Unavailable):
        a.claim(most(), Holder("a"))


def test_a_refused_release_changes_nothing(pools):
    a, _, _ = pools
    lease = a.claim(most(), Holder("alice"))
    with pytest.raises(Forbidden):
        a.release(lease.id, requester="mallory")
    with pytest.raises(Unavailable):
        a.claim(most(), Holder("bob"))
    a.release(lease.id, requester="alice")
    a.claim(most(), Holder("bob"))


def test_expiry_is_noticed_without_a_sweep(pools):
    a, b, clock = pools
    a.claim(most(), Holder("a"), ttl_s=10)
    with pytest.raises(Unavailable):
        b.claim(most(), Holder("b"))
    clock.now += 11
    lease = b.claim(most(), Holder("b"), ttl_s=10)  # the expired lease is reclaimed in this transaction
    clock.now += 5
    a.heartbeat(lease.id)  # expiry moves later: the views' lower bound stays safe
    clock.now += 8
    with pytest.raises(Unavailable):
        a.claim(most(), Holder("a"))


def test_new_databases_use_small_pages(tmp_path):
    Pool(tmp_path, devices=emulated_devices("emulated:1x16GiB", "n"), node="n").close()
    conn = sqlite3.connect(str(tmp_path / "pool.db"))
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 1024


def test_background_checkpoints_keep_the_wal_small(tmp_path, monkeypatch):
    from gpupool.pooling.store import db

    monkeypatch.setattr(db, "WAL_RESTART_BYTES", 1 << 20)
    passes = []
    checkpoint = db.Store._checkpoint

    def counted(self, *args):
        checkpoint(self, *args)
        passes.append(1)

    monkeypatch.setattr(db.Store, "_checkpoint", counted)
    pool = Pool(tmp_path, devices=emulated_devices("emulated:1x16GiB", "n"), node="n", background_checkpoint=True)
    assert pool.store.connection().execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    # Batches of ~1.2 MiB of WAL frames (~12 KiB a round), each followed by two whole passes of
    # the checkpointer: what it does, not how often a loaded machine lets it run. Without the
    # checkpoints the WAL would hold all ~9.6 MiB.
    for _batch in range(8):
        for _round in range(100):
            pool.release(pool.claim(most(), Holder("a")).id)
        seen = len(passes)
        wait_until(lambda seen=seen: len(passes) >= seen + 2, timeout=60, what="two checkpoint passes")
    wal = (tmp_path / "pool.db-wal").stat().st_size
    pool.close()
    assert wal < 4 << 20, wal
