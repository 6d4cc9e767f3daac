"""The samples on disk (store/samples.py): one row per minute, a retention, averaged into buckets when read."""

from __future__ import annotations

import sqlite3

import pytest

from gpupool.pooling.store import DB_NAME, Store, samples
from gpupool.pooling.store.samples import RETENTION_S, Sample

T0 = 1_800_000_000.0  # a whole minute


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path)
    yield s
    s.close()


def sample(at: float, used=100, queued=0, allocated=500) -> Sample:
    return Sample(at, 1000, allocated, used, 2, queued)


def test_one_row_per_minute_the_first_kept(store):
    with store.write() as tx:
        assert samples.write(tx, sample(T0 + 5, used=100))
        assert not samples.write(tx, sample(T0 + 50, used=900))  # the same minute: ignored
        assert samples.write(tx, sample(T0 + 61, used=300))
    with store.read() as tx:
        assert samples.count(tx) == 2
        rows = samples.read(tx, T0, T0 + 120, 2)
    assert [(r.at, r.used_mib) for r in rows] == [(T0 + 5, 100), (T0 + 61, 300)]


def test_a_write_drops_what_is_older_than_the_retention(store):
    with store.write() as tx:
        samples.write(tx, sample(T0 - RETENTION_S - 120))
        samples.write(tx, sample(T0 - RETENTION_S + 120))
    with store.read() as tx:
        assert samples.count(tx) == 2
    with store.write() as tx:
        samples.write(tx, sample(T0))
    with store.read() as tx:
        assert samples.count(tx) == 2
        assert [r.at for r in samples.read(tx, T0 - RETENTION_S - 600, T0, 10)] == [T0 - RETENTION_S + 120, T0]


def test_a_read_averages_each_bucket_and_leaves_out_the_empty_ones(store):
    with store.write() as tx:
        for minute in range(60):  # an hour: used 0..59, queue 1 in the first half, 3 in the second
            samples.write(tx, sample(T0 + 60 * minute, used=minute, queued=1 if minute < 30 else 3))
        samples.write(tx, sample(T0 + 3 * 3600, used=None))  # hours later, usage not sampled
    with store.read() as tx:
        rows = samples.read(tx, T0, T0 + 4 * 3600, 8)  # half-hour buckets
        outside = samples.read(tx, T0 + 3600, T0 + 2 * 3600, 8)
    assert [(r.at, r.used_mib, r.queued) for r in rows] == [
        (T0 + 60 * 29, 14, 1.0),  # the mean of 0..29 is 14.5: rounded to even
        (T0 + 60 * 59, 44, 3.0),
        (T0 + 3 * 3600, None, 0.0),
    ]
    assert all(r.total_mib == 1000 and r.allocated_mib == 500 and r.leases == 2.0 for r in rows)
    assert outside == []


def test_seven_days_read_back_in_the_buckets_asked_for(store):
    with store.write() as tx:
        for minute in range(0, RETENTION_S // 60, 7):
            samples.write(tx, sample(T0 + 60 * minute))
    with store.read() as tx:
        rows = samples.read(tx, T0, T0 + RETENTION_S, 120)
    assert len(rows) == 120 and all(T0 <= r.at <= T0 + RETENTION_S for r in rows)


def test_a_state_dir_from_before_the_table_gets_it_on_open(tmp_path):
    Store(tmp_path).close()
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute("DROP TABLE samples")
    conn.execute("PRAGMA user_version=0")  # as an older gpupool left it
    conn.commit()
    conn.close()
    store = Store(tmp_path)
    try:
        with store.write() as tx:
            assert samples.write(tx, sample(T0))
    finally:
        store.close()
