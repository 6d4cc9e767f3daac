"""The node's attestation socket: a runner proves, over a local Unix socket, that it holds a lease.

The caller sends one line (`core.attestation`): the lease id and the key the claim's answer gave
it. The node takes the caller's pid and uid from the kernel (SO_PEERCRED), its start time and pod
from /proc, and records them for the lease if the key is the lease's and the lease is live. The
socket is 0666: any local user may attest its own lease, the key proves which lease is its own.

Bounds: one line of at most MAX_LINE_BYTES, CONNECTION_TIMEOUT_S per connection from accept to
answer, MAX_CONNECTIONS served at once and MAX_CONNECTIONS_PER_CALLER of them per uid or pod (more are
answered "busy" and closed), and MAX_PIDS_PER_LEASE records per lease (`attest.Attestations`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from ..core.attestation import CONNECTION_TIMEOUT_S, MAX_LINE_BYTES, SUN_PATH_MAX, answer_line, parse_request
from ..core.errors import Forbidden, GpupoolError, InvalidInput, NotFound, Unavailable
from ..isolation.evidence import kube_pod_uid, peer_credentials, uptime_ticks, witness_peer
from ..pool import Pool
from .attest import Attestations, AttestKeys, node_attestations, socket_path
from .attribution import Attributor

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 16
# Of those, what one caller (a uid, or a pod on Kubernetes where pods often share uid 0) may hold.
MAX_CONNECTIONS_PER_CALLER = 4
_ACCEPT_POLL_S = 0.5
# After its answer, a caller's excess input is read and dropped for at most this long and this much.
_DRAIN_S = 0.2
_DRAIN_BYTES = 1 << 20


class AttestListener:
    """Serves the attestation socket at `path` from a thread, between `start()` and `stop()`."""

    def __init__(
        self,
        path: Path,
        keys: AttestKeys,
        attestations: Attestations,
        is_live: Callable[[str], bool],
        max_connections: int = MAX_CONNECTIONS,
        timeout_s: float = CONNECTION_TIMEOUT_S,
        max_per_caller: int = MAX_CONNECTIONS_PER_CALLER,
    ) -> None:
        self.path = Path(path)
        self.keys = keys
        self.attestations = attestations
        self.is_live = is_live
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self.max_per_caller = max_per_caller
        self._per_caller: Dict[Tuple[int, str], int] = {}
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> AttestListener:
        """Bind the socket (replacing a dead server's) and serve it from a daemon thread."""
        folder = self.path.parent
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)  # pods mount this folder: it holds the socket and nothing else
        try:
            self.path.unlink()  # a killed server's socket: the state lock says no server uses it
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with _short_path(self.path) as address:
                sock.bind(address)
            os.chmod(self.path, 0o666)
            sock.listen(64)
            sock.settimeout(_ACCEPT_POLL_S)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="gpupool-attest", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, remove the socket file; idempotent."""
        self._stop.set()
        if self._sock is not None:
            self._wake()
        if self._thread is not None:
            self._thread.join(timeout=_ACCEPT_POLL_S + 2)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                self.path.unlink()
            except OSError:
                pass

    def _wake(self) -> None:
        """Connect once, so the thread's accept() returns now and sees the stop (no wait for its poll)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock, _short_path(self.path) as address:
                sock.settimeout(0.5)
                sock.connect(address)
        except OSError:
            pass  # the poll ends it anyway

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                log.warning("attestation socket: accept failed", exc_info=True)
                time.sleep(0.1)
                continue
            if self._stop.is_set():
                conn.close()
                return
            accepted = uptime_ticks()
            caller = _caller(conn)
            if not self._take_slot(caller):
                busy = Unavailable("the node is busy with other attestations: try again in a second")
                _answer(conn, busy.to_dict(), drain=False)
                conn.close()
                continue
            threading.Thread(
                target=self._handle, args=(conn, accepted, caller), name="gpupool-attest-conn", daemon=True
            ).start()

    def _take_slot(self, caller: Tuple[int, str]) -> bool:
        """One of the node's slots, and one of the caller's own: one user (or pod) that stalls its
        connections holds at most MAX_CONNECTIONS_PER_CALLER, never everyone's."""
        with self._lock:
            if self._per_caller.get(caller, 0) >= self.max_per_caller:
                return False
            if not self._slots.acquire(blocking=False):
                return False
            self._per_caller[caller] = self._per_caller.get(caller, 0) + 1
            return True

    def _handle(self, conn: socket.socket, accepted: Optional[int], caller: Tuple[int, str]) -> None:
        try:
            _answer(conn, self.attest(conn, accepted))
        except OSError:  # the caller went away: nothing to answer
            pass
        except Exception:  # a bug must not end the listener
            log.exception("attestation failed")
        finally:
            conn.close()
            with self._lock:
                left = self._per_caller.pop(caller) - 1
                if left:
                    self._per_caller[caller] = left
            self._slots.release()

    def attest(self, conn: socket.socket, accepted: Optional[int]) -> Dict[str, Any]:
        """Read the caller's line and record its attestation; the answer as a dict."""
        try:
            line = _read_line(conn, time.monotonic() + self.timeout_s)
            lease_id, key = parse_request(line)
            witness = witness_peer(conn, accepted)
            if witness is None:
                raise Forbidden(
                    "the node cannot see the connecting process (another pid namespace, or gone): "
                    "attest from the runner itself, on the node that runs it"
                )
            if not self.keys.check(lease_id, key):
                raise Forbidden(f"the key is not lease {lease_id!r}'s: use the key its claim's answer gave")
            if not self.is_live(lease_id):
                raise NotFound(f"lease {lease_id!r} is not live here (released or expired)")
            self.attestations.add(lease_id, witness)
        except GpupoolError as err:
            log.info("attestation refused: %s", err.message)
            return err.to_dict()
        log.info("lease %s attested by pid %d (uid %d)", lease_id, witness.pid, witness.uid)
        return {"attested": {"lease_id": lease_id, "pid": witness.pid}}


def _caller(conn: socket.socket) -> Tuple[int, str]:
    """Who connected, for the per-caller cap: (uid, pod UID or '') from the kernel."""
    try:
        pid, uid, _ = peer_credentials(conn)
    except OSError:
        return (-1, "")
    return (uid, (kube_pod_uid(pid) or "") if pid > 0 else "")


def _read_line(conn: socket.socket, deadline: float) -> bytes:
    """One line of at most MAX_LINE_BYTES, read before `deadline`; InvalidInput otherwise."""
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise InvalidInput(f"no complete line within {CONNECTION_TIMEOUT_S:g}s: send the line at once")
        conn.settimeout(left)
        try:
            chunk = conn.recv(MAX_LINE_BYTES + 1 - len(data))
        except socket.timeout:
            continue
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_LINE_BYTES and b"\n" not in data:
            raise InvalidInput(
                f"the attestation line is over {MAX_LINE_BYTES} bytes: send one line of lease_id and key"
            )
    return data.split(b"\n", 1)[0]


def _answer(conn: socket.socket, payload: Dict[str, Any], drain: bool = True) -> None:
    """Send the answer line, then drop what the caller sent beyond its line: closing a Unix socket
    with unread input resets it, and the caller would lose the answer that says what was wrong."""
    try:
        conn.settimeout(0.5)
        conn.sendall(answer_line(payload))
        if not drain:  # the accept loop's own answer ("busy") never waits on the caller: it drops only
            conn.setblocking(False)  # what has already arrived, so closing does not reset the answer
            dropped = 0
            while dropped < _DRAIN_BYTES:
                chunk = conn.recv(65536)  # BlockingIOError (an OSError) once nothing more is queued
                if not chunk:
                    break
                dropped += len(chunk)
            return
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + _DRAIN_S
        dropped = 0
        while dropped < _DRAIN_BYTES and time.monotonic() < deadline:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = conn.recv(65536)
            if not chunk:
                break
            dropped += len(chunk)
    except OSError:
        pass


class _short_path:
    """A bindable address for `path`: itself, or /proc/self/fd/N/NAME through its folder when too long."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: Optional[int] = None

    def __enter__(self) -> str:
        if len(os.fsencode(str(self.path))) <= SUN_PATH_MAX:
            return str(self.path)
        self._fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        return f"/proc/self/fd/{self._fd}/{self.path.name}"

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)


@contextlib.contextmanager
def attestation_service(pool: Pool) -> Iterator[Attributor]:
    """The node's attestation socket for as long as it serves, and the Attributor that trusts it."""
    state = Path(pool.state_dir)
    attestations = node_attestations(state)
    path = socket_path(state)

    def is_live(lease_id: str) -> bool:
        try:
            pool.lease(lease_id)
        except NotFound:
            return False
        return True

    listener = AttestListener(path, AttestKeys(state), attestations, is_live)
    try:
        listener.start()
    except OSError as err:
        raise InvalidInput(
            f"cannot listen on the attestation socket {path}: {err.strerror}; give the server a writable --state"
        ) from None
    try:
        yield Attributor(attestations)
    finally:
        listener.stop()
