"""Issue 23 item 7: a state dir that held a pool never silently restarts as an empty one.

A zero-length or missing pool.db next to STATE/pool.id stops `gpupool server`, `run`, `status`
and `token` with exit 7 and one line naming the file and the fix; `gpupool doctor` says damaged;
`gpupool restore` brings the pool back; a fresh state dir still starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

import httpx
import pytest
from envs import clean_env
from gpupool_cli import gpupool
from waiting import wait_until

from gpupool.pooling.store import DB_NAME, Store
from gpupool.pooling.store.marker import MARKER_NAME, POOL_ID_KEY

DEVICES = "emulated:2x16GiB"


def serve(state: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    """Start `gpupool server` on STATE; it must exit by itself (a server that serves is killed: a failure)."""
    args = [sys.executable, "-m", "gpupool", "server", "--listen", "127.0.0.1:0", "--state", str(state)]
    proc = subprocess.Popen([*args, "--devices", DEVICES], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the server started on a lost database instead of refusing:\n{err}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert lines[0].startswith("gpupool: error: ")
    return lines[0]


@pytest.fixture
def held(server_factory, tmp_path) -> Path:
    """A state dir a real server served: one lease of alice's and one token, then the server stopped."""
    server = server_factory(state=tmp_path / "state")
    alice = httpx.post(server.url + "/v1/tokens", json={"name": "alice"}, headers=server.headers()).json()["token"]
    claim = {"claim": {"requests": [{"count": 1, "fraction": 0.5}]}, "ttl_s": 600}
    r = httpx.post(server.url + "/v1/leases", json=claim, headers={"Authorization": f"Bearer {alice}"})
    assert r.status_code == 201, r.text
    assert server.stop() == 0
    return server.state


def truncate(state: Path) -> None:
    """What the issue found: pool.db cut to 0 bytes (its -wal and -shm left as they were)."""
    os.truncate(state / DB_NAME, 0)


def delete(state: Path) -> None:
    (state / DB_NAME).unlink()
    for extra in ("-wal", "-shm"):
        (state / (DB_NAME + extra)).unlink(missing_ok=True)


def assert_refused(line: str, state: Path, what: str) -> None:
    assert str(state / DB_NAME) in line and what in line, line
    assert f"gpupool restore --state {state}" in line and f"gpupool doctor --state {state}" in line, line
    assert str(state / MARKER_NAME) in line, line


@pytest.mark.parametrize("lose, what", [(truncate, "empty (0 bytes)"), (delete, "missing")])
def test_a_lost_database_stops_the_server_with_exit_7(held, lose, what):
    lose(held)
    result = serve(held)
    assert result.returncode == 7, result.stderr
    assert_refused(error_line(result), held, what)
    assert not (held / DB_NAME).exists() or (held / DB_NAME).stat().st_size == 0  # nothing was written


@pytest.mark.parametrize("lose, what", [(truncate, "empty (0 bytes)"), (delete, "missing")])
def test_a_lost_database_stops_the_embedded_pool_and_doctor_says_damaged(held, lose, what):
    lose(held)
    tar = str(held.parent / "bob.tar")
    token = ["token", "create", "--server", "http://h:1", "--state", "S", "--name", "bob", "--out", tar]
    env = clean_env(held.parent, GPUPOOL_DEVICES=DEVICES)
    for argv in (["status", "--state", "S"], ["run", "--state", "S", "-p", "0.5", "--", "true"], token):
        result = gpupool(*(str(held) if a == "S" else a for a in argv), env=env)
        assert result.returncode == 7, (argv, result.stderr)
        assert_refused(error_line(result), held, what)
    doctor = gpupool("doctor", "--state", str(held), "--json", env=env)
    assert doctor.returncode == 7, doctor.stdout + doctor.stderr
    report = json.loads(doctor.stdout)
    assert report["healthy"] is False and report["problems"][0]["kind"] == "integrity"
    assert what in report["problems"][0]["message"]


def test_restore_brings_the_pool_back(held, tmp_path):
    copy = tmp_path / "backup.db"
    env = clean_env(held.parent, GPUPOOL_DEVICES=DEVICES)
    assert gpupool("backup", "--state", str(held), str(copy), env=env).returncode == 0
    truncate(held)
    assert gpupool("status", "--state", str(held), env=env).returncode == 7
    restored = gpupool("restore", "--state", str(held), str(copy), env=env)
    assert restored.returncode == 0, restored.stderr
    status = gpupool("status", "--state", str(held), "--json", env=env)
    assert status.returncode == 0, status.stderr
    (lease,) = json.loads(status.stdout)["leases"]
    assert lease["holder"]["name"] == "alice"
    assert gpupool("doctor", "--state", str(held), env=env).returncode == 0


def test_removing_pool_id_starts_an_empty_pool_on_purpose(held):
    old = (held / MARKER_NAME).read_text().strip()
    delete(held)
    (held / MARKER_NAME).unlink()
    status = gpupool("status", "--state", str(held), "--json", env=clean_env(held.parent, GPUPOOL_DEVICES=DEVICES))
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["leases"] == []
    assert (held / MARKER_NAME).read_text().strip() not in ("", old)  # a new pool, a new id


def test_a_fresh_state_dir_still_starts_and_is_marked(tmp_path):
    state = tmp_path / "fresh"
    env = clean_env(state.parent, GPUPOOL_DEVICES=DEVICES)
    status = gpupool("status", "--state", str(state), env=env)
    assert status.returncode == 0, status.stderr
    pool_id = (state / MARKER_NAME).read_text().strip()
    store = Store(state)
    try:
        with store.read() as tx:
            assert tx.meta(POOL_ID_KEY) == pool_id and len(pool_id) == 32
    finally:
        store.close()
    assert gpupool("doctor", "--state", str(state), env=env).returncode == 0


def test_racing_first_opens_of_a_fresh_dir_all_start(tmp_path):
    """Several embedded pools opening one new state dir at once: SQLite creates the file empty, but
    pool.id appears only after its schema committed, so none of them takes the new file for a lost one."""
    state = tmp_path / "race"
    env = clean_env(GPUPOOL_DEVICES=DEVICES, HOME=str(tmp_path / "home"))
    args = [sys.executable, "-m", "gpupool", "status", "--state", str(state)]
    procs: List[subprocess.Popen] = [
        subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env) for _ in range(4)
    ]
    try:
        errors = [(p.wait(60), p.stderr.read() if p.stderr else "") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
            if p.stderr:
                p.stderr.close()
    assert all(code == 0 for code, _ in errors), errors
    assert len((state / MARKER_NAME).read_text().strip()) == 32


def test_an_older_state_dir_gets_its_marker_at_the_next_open(tmp_path):
    state = tmp_path / "old"
    Store(state).close()
    (state / MARKER_NAME).unlink()  # as an older gpupool left it
    store = Store(state)
    try:
        with store.read() as tx:
            pool_id = tx.meta(POOL_ID_KEY)
    finally:
        store.close()
    assert pool_id and (state / MARKER_NAME).read_text().strip() == pool_id
    os.truncate(state / DB_NAME, 0)
    from gpupool.core.errors import StateUnusable

    with pytest.raises(StateUnusable, match="empty"):
        Store(state)


def test_the_damaged_message_s_way_to_an_empty_pool_works(held):
    """A damaged file's message says to move pool.db *and* pool.id aside; doing so starts an empty pool."""
    (held / DB_NAME).write_bytes(b"\x17garbage" * 700)
    for extra in ("-wal", "-shm"):
        (held / (DB_NAME + extra)).unlink(missing_ok=True)
    env = clean_env(held.parent, GPUPOOL_DEVICES=DEVICES)
    line = error_line(gpupool("status", "--state", str(held), env=env))
    assert "damaged" in line and f"move {DB_NAME} and {MARKER_NAME} aside" in line, line
    (held / DB_NAME).rename(held / "pool.db.damaged")
    assert gpupool("status", "--state", str(held), env=env).returncode == 7  # pool.id still says a pool lived here
    (held / MARKER_NAME).rename(held / "pool.id.damaged")
    assert gpupool("status", "--state", str(held), env=env).returncode == 0


def test_restore_refuses_while_a_run_holds_a_lease_and_names_it(held, tmp_path):
    """Issue 25: restore over a live embedded pool killed the run's lease (exit 6); now it is refused."""
    copy = tmp_path / "backup.db"
    cli_env = clean_env(held.parent, GPUPOOL_DEVICES=DEVICES)
    assert gpupool("backup", "--state", str(held), str(copy), env=cli_env).returncode == 0
    marker = tmp_path / "started"
    env = clean_env(GPUPOOL_DEVICES=DEVICES, HOME=str(held.parent / "home"))
    hold = (
        f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(600)"  # held until the test kills it
    )
    argv = ["run", "--state", str(held), "-p", "0.25", "--", sys.executable, "-c", hold]
    run = subprocess.Popen([sys.executable, "-m", "gpupool", *argv], env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(marker.exists, 60, "the run's command")
        refused = gpupool("restore", "--state", str(held), str(copy), env=cli_env)
        assert refused.returncode == 2, refused.stderr
        assert f"{run.pid}" in refused.stderr and "let them end" in refused.stderr, refused.stderr
        error_line(refused)
        assert (held / DB_NAME).exists()
    finally:
        run.kill()
        run.wait()
