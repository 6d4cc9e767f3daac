"""Issue 9: `gpupool doctor` passes on a healthy pool and names each hand-corrupted row; backup and restore."""

from __future__ import annotations

import json
import logging
import sqlite3

import pytest

from gpupool.cli.main import main
from gpupool.core.errors import InvalidInput, StateLocked
from gpupool.core.model import Claim, Holder
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool
from gpupool.pooling.pool.doctor import check_state
from gpupool.pooling.store import StateLock
from gpupool.pooling.store.maintenance import backup, restore


@pytest.fixture
def state(tmp_path):
    """A pool with one lease of half a GPU and one token."""
    path = tmp_path / "state"
    pool = Pool(path, devices=emulated_devices("2x16GiB", "n"))
    pool.claim(Claim.single(1, fraction=0.5), Holder("alice", 1, "h"), ttl_s=600)
    pool.close()
    return path


def corrupt(state, sql: str, *params) -> None:
    conn = sqlite3.connect(state / "pool.db")
    conn.execute(sql, params)
    conn.commit()
    conn.close()


def test_a_healthy_pool_passes(state, capsys):
    report = check_state(state)
    assert report.healthy and report.leases == 1 and report.devices == 2
    assert main(["doctor", "--state", str(state)]) == 0
    assert "healthy" in capsys.readouterr().out


@pytest.mark.parametrize(
    "sql, kind, named",
    [
        ("UPDATE slices SET memory_mib = 99999", "device_overcommitted", "99999 MiB"),
        ("INSERT INTO slices VALUES ('ghost', 'GPU-emu-n-0', 512, 0)", "orphan_slices", "ghost"),
        ("UPDATE slices SET device_uuid = 'GPU-gone'", "lease_on_unknown_device", "GPU-gone"),
        ("UPDATE leases SET holder = '{not json'", "bad_lease", "does not parse"),
        (
            "INSERT INTO tickets (claim, holder, host, pid, created_at, expires_at) VALUES ('x', '{}', 'h', 1, 2, 1)",
            "bad_ticket",
            "queue ticket",
        ),
        ("UPDATE slices SET memory_mib = 0", "bad_slice", "0 MiB"),
        ("UPDATE devices SET memory_mib = -1 WHERE idx = 1", "bad_device", "-1"),
    ],
)
def test_a_hand_corrupted_row_fails_and_is_named(state, capsys, sql, kind, named):
    corrupt(state, sql)
    report = check_state(state)
    assert not report.healthy
    found = [p for p in report.problems if p.kind == kind]
    assert found and named in found[0].message, report.lines()
    assert main(["doctor", "--state", str(state)]) == 1
    out = capsys.readouterr().out
    assert "problem(s)" in out and kind in out
    assert main(["doctor", "--json", "--state", str(state)]) == 1
    assert json.loads(capsys.readouterr().out)["healthy"] is False


def test_a_damaged_file_is_exit_7(state, capsys):
    db = state / "pool.db"
    corrupt(state, "PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    data[2048:4096] = b"\xff" * 2048  # a b-tree page of the file, overwritten
    db.write_bytes(bytes(data))
    assert main(["doctor", "--state", str(state)]) == 7
    assert "integrity" in capsys.readouterr().out


def test_backup_and_restore_bring_a_pool_back(state, tmp_path, capsys):
    copy = tmp_path / "backups" / "pool.db"
    assert main(["backup", "--state", str(state), str(copy)]) == 0
    with pytest.raises(InvalidInput, match="exists already"):
        backup(state, copy)
    (state / "pool.db").write_bytes(b"garbage" * 1000)
    assert main(["status", "--state", str(state)]) == 7
    capsys.readouterr()
    with StateLock(state), pytest.raises(StateLocked):
        restore(state, copy)
    assert main(["restore", "--state", str(state), str(copy)]) == 0
    assert "previous database" in capsys.readouterr().err
    assert check_state(state).healthy
    pool = Pool(state)
    try:
        (lease,) = pool.status().leases
        assert lease.holder.name == "alice"
    finally:
        pool.close()
    not_a_backup = tmp_path / "x.db"
    sqlite3.connect(not_a_backup).close()
    with pytest.raises(InvalidInput, match="not a gpupool pool database"):
        restore(state, not_a_backup)
    assert main(["restore", "--state", str(state), str(tmp_path / "missing.db")]) == 2


def test_the_server_checks_at_start(state, tmp_path, caplog):
    from gpupool.serving.server.serve import ServerConfig, prepare

    corrupt(state, "INSERT INTO slices VALUES ('ghost', 'GPU-emu-n-0', 512, 0)")
    with caplog.at_level(logging.WARNING):
        prepare(ServerConfig(listen="127.0.0.1:0", state_dir=str(state))).close()
    assert "doctor: orphan_slices" in caplog.text


def test_doctor_over_http_is_admin_only(state):
    from fastapi.testclient import TestClient

    from gpupool.serving.server.app import create_app
    from gpupool.serving.server.auth import Authenticator, create_token

    pool = Pool(state)
    try:
        app = create_app(pool, Authenticator("admin-token-0123456789", pool.store))
        alice = create_token(pool.store, "alice")
        with TestClient(app) as c:
            r = c.get("/v1/doctor", headers={"Authorization": "Bearer admin-token-0123456789"})
            assert r.status_code == 200 and r.json()["healthy"] is True
            assert c.get("/v1/doctor", headers={"Authorization": f"Bearer {alice}"}).status_code == 403
    finally:
        pool.close()
