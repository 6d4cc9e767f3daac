"""The node's attestation socket in process: a real Unix socket, a real pool on SQLite, real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Optional, Tuple

import pytest
from waiting import wait_until

from gpupool.core.attestation import MAX_LINE_BYTES, request_line
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Claim, Holder
from gpupool.devices import emulated_devices
from gpupool.enforcement.attest import RECORDS_FILE, SECRET_FILE, Attestations, AttestKeys, socket_path
from gpupool.enforcement.attest_listener import AttestListener
from gpupool.isolation.evidence import Witness, start_ticks
from gpupool.pool import Pool
from gpupool.runner.attest import AttestFailed, attest


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Tuple[Pool, AttestListener]]:
    pool = Pool(tmp_path / "state", devices=emulated_devices("emulated:2x16GiB", "n1"))

    def is_live(lease_id: str) -> bool:
        return any(lease.id == lease_id for lease in pool.status().leases)

    state = pool.state_dir
    listener = AttestListener(
        socket_path(state), AttestKeys(state), Attestations(state / RECORDS_FILE), is_live, max_connections=4
    ).start()
    yield pool, listener
    listener.stop()
    pool.close()


def claim(pool: Pool, pid: int = 1) -> str:
    return pool.claim(Claim.single(1, fraction=0.25), Holder("alice", pid, "anywhere")).id


def exchange(path: Path, data: bytes, timeout: float = 5.0) -> Tuple[dict, float]:
    """Send `data` raw, read until the node closes; the answer and the seconds it took."""
    started = time.monotonic()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        if data:
            sock.sendall(data)
        answer = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    return json.loads(answer.decode()), time.monotonic() - started


def test_the_kernel_says_who_attests_not_the_line(node, tmp_path):
    pool, listener = node
    lease_id = claim(pool)  # the holder pid 1 is a label: the record is of whoever connects
    key = listener.keys.key(lease_id)
    assert attest(str(listener.path), lease_id, key) == os.getpid()
    # A child attesting on its own: the node records the child's pid and start time.
    code = f"from gpupool.runner.attest import attest; print(attest({str(listener.path)!r}, {lease_id!r}, {key!r}))"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert child.returncode == 0, child.stderr
    recorded = listener.attestations.current({lease_id})[lease_id]
    assert [w.pid for w in recorded] == [os.getpid(), int(child.stdout)]
    assert recorded[0] == Witness(os.getpid(), start_ticks(os.getpid()) or -1, os.getuid(), "")
    # Mirrored for a restarted server, 0600, with the secret beside it (never in the socket's folder).
    assert Attestations(pool.state_dir / RECORDS_FILE).current({lease_id}) == {lease_id: recorded}
    for name in (RECORDS_FILE, SECRET_FILE):
        assert (pool.state_dir / name).stat().st_mode & 0o777 == 0o600
    assert os.listdir(listener.path.parent) == [listener.path.name]
    assert listener.path.stat().st_mode & 0o777 == 0o666


def test_a_wrong_key_another_leases_id_and_a_released_lease_are_refused(node):
    pool, listener = node
    mine, theirs = claim(pool), claim(pool)
    my_key = listener.keys.key(mine)
    for lease_id, key, code in [
        (mine, "0" * 64, "forbidden"),
        (theirs, my_key, "forbidden"),  # my key does not open another lease
        ("no-such-lease", my_key, "forbidden"),
    ]:
        answer, _ = exchange(listener.path, request_line(lease_id, key))
        assert answer["error"]["code"] == code and lease_id in answer["error"]["message"], answer
    pool.release(mine)
    answer, _ = exchange(listener.path, request_line(mine, my_key))
    assert answer["error"]["code"] == "not_found"
    assert listener.attestations.current({mine, theirs}) == {}
    with pytest.raises(AttestFailed, match="not lease"):
        attest(str(listener.path), theirs, my_key)


@pytest.mark.parametrize(
    "data, text",
    [
        (b"not json\n", "not JSON"),
        (b"\xff\xfe\n", "not JSON"),
        (b"[1, 2]\n", "exactly"),
        (b'{"lease_id": "x", "key": "y", "pid": 1}\n', "exactly"),
        (b'{"lease_id": 7, "key": "y"}\n', "strings"),
        (b"x" * (MAX_LINE_BYTES + 10), f"over {MAX_LINE_BYTES} bytes"),
        (b'{"lease_id": "' + b"x" * 100_000 + b'"}\n', f"over {MAX_LINE_BYTES} bytes"),
        (b"", "not JSON"),  # connected and closed its side at once
    ],
)
def test_bad_lines_get_one_error_line_and_the_connection_is_closed(node, data, text):
    _, listener = node
    if data:
        answer, took = exchange(listener.path, data)
    else:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(listener.path))
            sock.shutdown(socket.SHUT_WR)
            answer = json.loads(sock.makefile("rb").readline())
            took = 0.0
    assert answer["error"]["code"] == "invalid_input" and text in answer["error"]["message"], answer
    assert took < 1.0


def busy_or(answer: dict) -> Optional[dict]:
    """`answer`, or None while the node still says it is busy."""
    return None if answer.get("error", {}).get("code") == "unavailable" else answer


def test_a_stalled_connection_is_cut_after_2_s_and_the_cap_answers_busy(node):
    _, listener = node
    # Four stalled callers hold every slot; the fifth is told "busy" at once.
    stalled = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(4)]
    try:
        started = time.monotonic()
        for sock in stalled:
            sock.connect(str(listener.path))
            sock.sendall(b'{"lease_id": ')  # never finished
        time.sleep(0.2)
        answer, took = exchange(listener.path, b"")
        assert answer["error"]["code"] == "unavailable" and took < 0.5
        # A runner whose whole line is already sent reads "busy" too, and asks again.
        for _ in range(20):
            with pytest.raises(AttestFailed) as refused:
                attest(str(listener.path), "L", "k" * 64, timeout_s=1.0)
            assert refused.value.code == "unavailable", refused.value
        for sock in stalled:
            sock.settimeout(5)
            line = sock.makefile("rb").readline()
            assert b"within 2s" in line
            assert sock.recv(1) == b""  # closed by the node
        assert 1.9 <= time.monotonic() - started <= 3.5
    finally:
        for sock in stalled:
            sock.close()
    # The slots are free again (each as soon as its handler has let go of it).
    answer = wait_until(lambda: busy_or(exchange(listener.path, b"{}\n")[0]), 5, "a free slot")
    assert answer["error"]["code"] == "invalid_input"


def test_one_lease_attests_at_most_64_processes():
    records = Attestations(max_per_lease=2)
    records.add("L", Witness(10, 1, 0))
    records.add("L", Witness(10, 1, 0))  # the same process again: nothing new
    records.add("L", Witness(11, 1, 0))
    records.add("L", Witness(11, 2, 0))  # pid 11 reused: the new process replaces the old record
    with pytest.raises(InvalidInput, match="the most one lease may"):
        records.add("L", Witness(12, 1, 0))
    assert records.current({"L"}) == {"L": [Witness(10, 1, 0), Witness(11, 2, 0)]}
    assert Attestations().max_per_lease == 64


def test_a_socket_path_longer_than_sun_path_works(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    pool = Pool(deep / "state", devices=emulated_devices("emulated:1x16GiB", "n1"))
    listener = AttestListener(
        socket_path(pool.state_dir), AttestKeys(pool.state_dir), Attestations(), lambda lease_id: True
    ).start()
    try:
        assert len(str(listener.path)) > 108 and listener.path.exists()
        assert attest(str(listener.path), "L1", listener.keys.key("L1")) == os.getpid()
    finally:
        started = time.monotonic()
        listener.stop()
        stopped_s = time.monotonic() - started
        pool.close()
    assert not listener.path.exists()
    assert stopped_s < 0.3, "a stopping server waits for no accept poll"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a caller as another user")
def test_one_caller_stalling_its_connections_does_not_block_another_users(tmp_path):
    import tempfile

    state = Path(tempfile.mkdtemp(prefix="attest-", dir="/tmp"))  # reachable by another user
    os.chmod(state, 0o755)
    listener = AttestListener(
        socket_path(state), AttestKeys(state), Attestations(), lambda lease_id: True, max_per_caller=2
    ).start()
    stalled = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
    try:
        for sock in stalled:
            sock.connect(str(listener.path))
        time.sleep(0.1)
        answer, took = exchange(listener.path, b"")  # this user's third connection: busy at once
        assert answer["error"]["code"] == "unavailable" and took < 0.5
        code = (
            # Everything imported first: the other user may not read this interpreter's files.
            "import os, socket, sys; from gpupool.runner.attest import attest; os.setgid(65534); os.setuid(65534); "
            "print(attest(sys.argv[1], 'L', sys.argv[2]))"
        )
        other = subprocess.run(
            [sys.executable, "-c", code, str(listener.path), listener.keys.key("L")],
            capture_output=True,
            text=True,
            timeout=30,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
        )
        assert other.returncode == 0, other.stderr
        (witness,) = listener.attestations.current({"L"})["L"]
        assert (witness.pid, witness.uid) == (int(other.stdout), 65534)
    finally:
        for sock in stalled:
            sock.close()
        listener.stop()
        for path in sorted(state.rglob("*"), reverse=True):
            path.unlink() if not path.is_dir() else path.rmdir()
        state.rmdir()
