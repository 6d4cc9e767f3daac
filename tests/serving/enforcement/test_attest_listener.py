"""The node's attestation socket in process: a real Unix socket, a real pool on SQLite, real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Tuple

import pytest

from gpupool.core.attestation import MAX_LINE_BYTES, request_line
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Claim, Holder
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.isolation.evidence import Witness, start_ticks
from gpupool.pooling.pool import Pool
from gpupool.serving.enforcement.attest import RECORDS_FILE, SECRET_FILE, Attestations, AttestKeys, socket_path
from gpupool.serving.enforcement.attest_listener import AttestListener
from gpupool.workload.runner.attest import AttestFailed, attest


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


def attest_as(uid: int, listener: AttestListener, lease_id: str) -> subprocess.CompletedProcess[str]:
    """`lease_id` attested on `listener` by a process of user `uid` (forked as root); its stdout is the
    pid the node answered."""
    code = (
        # Everything imported first: the other user may not read this interpreter's files.
        "import json, os, socket, sys; from gpupool.workload.runner.attest import attest; "
        "os.setgroups([]); os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1])); "
        "print(attest(sys.argv[2], sys.argv[3], sys.argv[4]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(uid), str(listener.path), lease_id, listener.keys.key(lease_id)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )


def test_the_kernel_says_who_attests_not_the_line(node, tmp_path):
    pool, listener = node
    lease_id = claim(pool)  # the holder pid 1 is a label: the record is of whoever connects
    key = listener.keys.key(lease_id)
    assert attest(str(listener.path), lease_id, key) == os.getpid()
    # A child attesting on its own: the node records the child's pid and start time.
    code = f"from gpupool.workload.runner.attest import attest; print(attest({str(listener.path)!r}, {lease_id!r}, {key!r}))"
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
    # judged on the line itself (its message says so), not cut at the 2 s deadline; not held either
    assert took < 20


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(path))
    return sock


def answer_of(sock: socket.socket) -> dict:
    """The node's answer line on `sock`, once the node has closed it."""
    line = sock.makefile("rb").readline()
    assert sock.recv(1) == b"", "closed by the node"
    return json.loads(line)


def readable(sock: socket.socket, timeout: float = 0.0) -> bool:
    import select

    return bool(select.select([sock], [], [], timeout)[0])


def test_a_line_is_due_2_s_after_the_accept_however_it_trickles(node):
    """The deadline counts from the accept, not per read: a byte every 0.2 s buys no time."""
    _, listener = node
    silent, trickler = connect(listener.path), connect(listener.path)
    started = time.monotonic()
    try:
        while time.monotonic() - started < 20 and not readable(trickler, 0.2):
            trickler.send(b" ")  # never a newline
        assert readable(trickler), "the trickler was never cut"
        assert time.monotonic() - started >= 1.9  # and never before its deadline
        for sock in (silent, trickler):
            answer = answer_of(sock)
            assert answer["error"]["code"] == "invalid_input" and "within 2s" in answer["error"]["message"]
    finally:
        silent.close()
        trickler.close()


def test_a_callers_next_connection_closes_its_own_oldest(node):
    """One caller holds at most 4 connections open: its next one is taken, and its own oldest closed."""
    _, listener = node  # this fixture's node: 4 connections in all, 4 per caller
    held = [connect(listener.path) for _ in range(4)]
    try:
        held.append(connect(listener.path))
        assert answer_of(held[0])["error"]["code"] == "unavailable"
        answer, _ = exchange(listener.path, b"{}\n")  # served, not told "busy"
        assert answer["error"]["code"] == "invalid_input", answer
        busy = answer_of(held[1])["error"]
        assert busy["code"] == "unavailable" and "at most 4 attestations of one user" in busy["message"], busy
        assert not any(readable(sock) for sock in held[2:]), "the newer ones are still open, unanswered"
    finally:
        for sock in held:
            sock.close()


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
    # woken at once: a stop that waited for its serving thread would spend the join's 5 s
    assert stopped_s < 4, "a stopping server waits for no accept poll"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a caller as another user")
def test_a_full_node_closes_the_biggest_holders_oldest_not_a_newcomer(tmp_path):
    import tempfile

    state = Path(tempfile.mkdtemp(prefix="attest-", dir="/tmp"))  # reachable by another user
    os.chmod(state, 0o755)
    listener = AttestListener(
        socket_path(state), AttestKeys(state), Attestations(), lambda lease_id: True, max_connections=2
    ).start()
    stalled = [connect(listener.path) for _ in range(2)]  # this user fills the node
    try:
        other = attest_as(65534, listener, "L")
        assert other.returncode == 0, other.stderr
        (witness,) = listener.attestations.current({"L"})["L"]
        assert (witness.pid, witness.uid) == (int(other.stdout), 65534)
        busy = answer_of(stalled[0])["error"]
        assert busy["code"] == "unavailable" and "the node holds 2 attestation connections" in busy["message"]
        assert not readable(stalled[1])
    finally:
        for sock in stalled:
            sock.close()
        listener.stop()
        for path in sorted(state.rglob("*"), reverse=True):
            path.unlink() if not path.is_dir() else path.rmdir()
        state.rmdir()
