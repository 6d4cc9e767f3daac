"""Issue 9: every reported CLI misuse ends in one line on stderr and a documented exit code."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from gpupool.cli.main import main
from gpupool.core.errors import StateUnusable
from gpupool.core.model import MIN_FRACTION, GpuRequest
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.store import Store


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("gpupool: error: ")
    return err[0]


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPOOL_DEVICES", "emulated:1x8GiB")
    monkeypatch.delenv("GPUPOOL_SERVER", raising=False)
    monkeypatch.setenv("GPUPOOL_CONFIG", str(tmp_path / "no-client.yaml"))
    monkeypatch.delenv("GPUPOOL_CONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path / "state"


@pytest.mark.parametrize("wait", ["nan", "inf", "1e12", "-1", "-inf"])
def test_bad_wait_is_exit_2_before_anything_is_claimed(state, capsys, wait):
    assert main(["run", "--state", str(state), "-p", "1", f"--wait={wait}", "--", "true"]) == 2
    assert "--wait" in one_line(capsys)


@pytest.mark.parametrize("ttl", ["nan", "inf", "0", "1e12"])
def test_bad_ttl_is_exit_2(state, capsys, ttl):
    assert main(["run", "--state", str(state), f"--ttl={ttl}", "--", "true"]) == 2
    assert "--ttl" in one_line(capsys)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://[::1", "http://a b", "http://:80", "http://h\x01"]
)
@pytest.mark.parametrize("verb", [["status"], ["run", "--", "true"], ["release", "abc"]])
def test_malformed_server_urls_are_exit_2(state, capsys, url, verb):
    assert main([*verb[:1], "--server", url, *verb[1:]]) == 2
    assert "is malformed" in one_line(capsys)


def test_token_create_with_a_malformed_url_is_exit_2(tmp_path, capsys):
    out = tmp_path / "b.tar"
    assert main(["token", "create", "--server", "http://[::1", "--state", str(tmp_path), "--out", str(out)]) == 2
    assert "is malformed" in one_line(capsys)


def _damage(state, how: str) -> None:
    Store(state).close()
    db = state / "pool.db"
    if how == "truncated":
        db.write_bytes(db.read_bytes()[:3000])
    else:
        db.write_bytes(b"\x17garbage" * 700)
    for extra in ("pool.db-wal", "pool.db-shm"):
        (state / extra).unlink(missing_ok=True)


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_a_damaged_database_names_the_file_the_damage_and_the_recovery(state, capsys, how):
    _damage(state, how)
    for argv in (["status"], ["run", "--", "true"]):
        assert main([argv[0], "--state", str(state), *argv[1:]]) == 7
        line = one_line(capsys)
        assert str(state / "pool.db") in line and "damaged" in line
        assert f"gpupool restore --state {state}" in line
    out = state.parent / "b.tar"
    assert main(["token", "create", "--server", "http://h:1", "--state", str(state), "--out", str(out)]) == 7
    one_line(capsys)


def test_a_damaged_database_in_a_real_process_prints_no_traceback(state):
    _damage(state, "garbage")
    r = subprocess.run(
        [sys.executable, "-m", "gpupool", "status", "--state", str(state)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 7 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_read_only_state_dir_says_so(state, capsys, monkeypatch):
    Store(state).close()
    import os

    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(state) else real_access(p, mode))
    for argv in (["status"], ["run", "--", "true"]):
        assert main([argv[0], "--state", str(state), *argv[1:]]) == 7
        assert "read-only" in one_line(capsys)
    out = state.parent / "b.tar"
    assert main(["token", "create", "--server", "http://h:1", "--state", str(state), "--out", str(out)]) == 7
    assert "read-only" in one_line(capsys)


def test_a_database_sqlite_opens_read_only_says_so(state, monkeypatch):
    # As root the permission bits do not stop writes; SQLite's read-only mode gives the same error.
    Store(state).close()
    real_connect = sqlite3.connect

    def read_only(path, *args, **kwargs):
        return real_connect(f"file:{path}?mode=ro", *args, uri=True, **kwargs)

    monkeypatch.setattr("gpupool.pooling.store.db.sqlite3.connect", read_only)
    store = Store(state)
    try:
        with pytest.raises(StateUnusable, match="read-only"), store.write() as tx:
            tx.set_meta("k", "v")
    finally:
        store.close()


# --- 4. the smallest share -----------------------------------------------------------
def test_a_fraction_that_would_round_to_nothing_is_refused_with_the_fix(state, capsys):
    assert main(["run", "--state", str(state), "-p", "1e-15", "--", "true"]) == 2
    assert "-m 1" in one_line(capsys)
    with pytest.raises(Exception, match="smallest share"):
        GpuRequest(1, fraction=MIN_FRACTION / 2)


def test_the_smallest_fraction_is_granted_at_least_one_mib():
    for device in emulated_devices("1x1GiB,1x80GiB", "n"):
        assert GpuRequest(1, fraction=MIN_FRACTION).memory_on(device) == 1


def test_an_unknown_suspend_backend_is_exit_2_before_anything_is_claimed(state, capsys, monkeypatch):
    monkeypatch.setenv("GPUPOOL_SUSPEND_BACKEND", "criu")
    ran = state.parent / "ran"
    assert main(["run", "--state", str(state), "-p", "1", "--", "touch", str(ran)]) == 2
    line = one_line(capsys)
    assert "GPUPOOL_SUSPEND_BACKEND='criu'" in line and "cuda, emulated, auto" in line
    assert not ran.exists()
