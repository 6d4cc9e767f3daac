"""The node's attestation socket: a runner proves, over a local Unix socket, that it holds a lease.

The caller sends one line (`core.attestation`): the lease id and the key the claim's answer gave
it. The node takes the caller's pid and uid from the kernel (SO_PEERCRED), its start time and pod
from /proc, and records them for the lease if the key is the lease's and the lease is live. The
socket is 0666: any local user may attest its own lease, the key proves which lease is its own.

The socket is no shared resource a stranger can use up: one thread serves every connection
(nothing waits on a caller), each connection has CONNECTION_TIMEOUT_S from its accept to send its
whole line, and each caller (a uid, or a pod on Kubernetes) has a budget of its own,
MAX_CONNECTIONS_PER_CALLER open at once: its next connection closes its own oldest, never
another caller's. When MAX_CONNECTIONS are open in all, a new one closes the oldest of the caller
holding the most. A runner sends its line at once, and a line already there at accept is answered
then. At most MAX_PIDS_PER_LEASE records per lease (`attest.Attestations`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ...core.attestation import CONNECTION_TIMEOUT_S, MAX_LINE_BYTES, SUN_PATH_MAX, answer_line, parse_request
from ...core.errors import Forbidden, GpupoolError, InvalidInput, NotFound, Unavailable
from ...pooling.isolation.evidence import kube_pod_uid, peer_credentials, uptime_ticks, witness_peer
from ...pooling.pool import Pool
from .attest import Attestations, AttestKeys, node_attestations, socket_path
from .attribution import Attributor

log = logging.getLogger(__name__)

# Connections open at once in all: far more than the callers of one node, and few enough fds.
MAX_CONNECTIONS = 128
# What one caller (a uid, or a pod on Kubernetes where pods often share uid 0) may hold open at once.
MAX_CONNECTIONS_PER_CALLER = 4
# Connections taken from the backlog in one turn, fewer than MAX_CONNECTIONS: a runner's line is
# read before a turn's newcomers could push its connection out as the oldest.
_ACCEPTS_PER_TURN = 32
# What a caller sent beyond its line is dropped, up to this much, before its connection is closed.
_DRAIN_BYTES = 1 << 20


class _Conn:
    """One open connection: who (from the kernel), since when, and the bytes of its line so far."""

    __slots__ = ("sock", "caller", "accepted_ticks", "deadline", "data")

    def __init__(self, sock: socket.socket, caller: str, accepted_ticks: Optional[int], deadline: float) -> None:
        self.sock = sock
        self.caller = caller
        self.accepted_ticks = accepted_ticks
        self.deadline = deadline
        self.data = b""


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
        self.max_connections = max_connections
        self.max_per_caller = max_per_caller
        # Open connections oldest first (accept order, so also deadline order), and per caller.
        self._open: Dict[int, _Conn] = {}
        self._by_caller: Dict[str, List[_Conn]] = {}
        self._selector: Optional[selectors.BaseSelector] = None
        self._sock: Optional[socket.socket] = None
        self._waker: Optional[socket.socket] = None
        self._woken: Optional[socket.socket] = None
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
            sock.listen(socket.SOMAXCONN)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._woken, self._waker = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ)
        self._selector.register(self._woken, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._serve, name="gpupool-attest", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close every connection, remove the socket file; idempotent."""
        if self._waker is not None:
            with contextlib.suppress(OSError):
                self._waker.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for conn in list(self._open.values()):
            self._close(conn)
        for sock in (self._sock, self._waker, self._woken):
            if sock is not None:
                sock.close()
        if self._selector is not None:
            self._selector.close()
        if self._sock is not None:
            try:
                self.path.unlink()
            except OSError:
                pass
        self._sock = self._waker = self._woken = None
        self._selector = None

    def _serve(self) -> None:
        """The one loop: read the lines that arrived, take newcomers, cut the connections past their deadline."""
        assert self._selector is not None and self._sock is not None
        while True:
            oldest = next(iter(self._open.values()), None)
            wait = None if oldest is None else max(oldest.deadline - time.monotonic(), 0.0)
            try:
                events = self._selector.select(wait)
            except OSError:  # closed under us by a stop that gave up waiting
                return
            listening = False
            for key, _ in events:
                if key.fileobj is self._woken:
                    return
                if key.fileobj is self._sock:
                    listening = True
                elif key.fd in self._open:  # lines first: callers already here before newcomers
                    self._read(self._open[key.fd])
            if listening:
                self._accept()
            self._expire()

    def _accept(self) -> None:
        assert self._sock is not None
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of fds, say: the backlog keeps the callers for the next turn
                log.warning("attestation socket: accept failed: %s", err)
                time.sleep(0.05)
                return
            sock.setblocking(False)
            conn = _Conn(sock, _caller(sock), uptime_ticks(), time.monotonic() + self.timeout_s)
            self._make_room(conn.caller)
            self._open[sock.fileno()] = conn
            self._by_caller.setdefault(conn.caller, []).append(conn)
            self._read(conn)  # a runner's line is usually there already: answered now, no slot kept
            if sock.fileno() in self._open:
                assert self._selector is not None
                self._selector.register(sock, selectors.EVENT_READ)

    def _make_room(self, caller: str) -> None:
        """Room for one more connection of `caller`: past its own budget its oldest goes; past the
        node's, the oldest of whoever holds the most. Either way the cost falls on those who hold."""
        mine = self._by_caller.get(caller, [])
        if len(mine) >= self.max_per_caller:
            self._evict(mine[0], f"at most {self.max_per_caller} attestations of one user are open at once")
        elif len(self._open) >= self.max_connections:
            holder = max(self._by_caller.values(), key=lambda conns: (len(conns), -conns[0].deadline))
            self._evict(holder[0], f"the node holds {self.max_connections} attestation connections")

    def _evict(self, conn: _Conn, why: str) -> None:
        busy = Unavailable(f"{why}, and this one was the oldest: send the line at once after connecting")
        self._finish(conn, busy.to_dict())

    def _read(self, conn: _Conn) -> None:
        """Take what `conn` sent; once its line is whole (or it is over size, or closed), answer it."""
        try:
            chunk = conn.sock.recv(MAX_LINE_BYTES + 1 - len(conn.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the caller went away: nothing to answer
            self._close(conn)
            return
        conn.data += chunk
        if b"\n" in conn.data or not chunk or len(conn.data) > MAX_LINE_BYTES:
            self._finish(conn, self.attest(conn))

    def _expire(self) -> None:
        """Answer and close every connection whose line did not come within the deadline from its accept."""
        now = time.monotonic()
        while self._open:
            conn = next(iter(self._open.values()))
            if conn.deadline > now:
                return
            late = InvalidInput(f"no complete line within {self.timeout_s:g}s: send the line at once")
            self._finish(conn, late.to_dict())

    def attest(self, conn: _Conn) -> Dict[str, Any]:
        """Check the caller's line and record its attestation; the answer as a dict."""
        try:
            if b"\n" not in conn.data and len(conn.data) > MAX_LINE_BYTES:
                raise InvalidInput(
                    f"the attestation line is over {MAX_LINE_BYTES} bytes: send one line of lease_id and key"
                )
            lease_id, key = parse_request(conn.data.split(b"\n", 1)[0])
            witness = witness_peer(conn.sock, conn.accepted_ticks)
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
        except Exception:  # a bug must not end the listener
            log.exception("attestation failed")
            return GpupoolError("the node failed to record the attestation: see its log").to_dict()
        log.info("lease %s attested by pid %d (uid %d)", lease_id, witness.pid, witness.uid)
        return {"attested": {"lease_id": lease_id, "pid": witness.pid}}

    def _finish(self, conn: _Conn, payload: Dict[str, Any]) -> None:
        """Send the answer line (it always fits a fresh socket's buffer), drop what the caller sent
        beyond its line (closing a Unix socket with unread input resets it), and close."""
        try:
            conn.sock.send(answer_line(payload))
            conn.sock.shutdown(socket.SHUT_WR)
            dropped = 0
            while dropped < _DRAIN_BYTES:
                chunk = conn.sock.recv(65536)  # BlockingIOError (an OSError) once nothing more is queued
                if not chunk:
                    break
                dropped += len(chunk)
        except OSError:
            pass
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if self._open.pop(fd, None) is None:
            return
        mine = self._by_caller[conn.caller]
        mine.remove(conn)
        if not mine:
            del self._by_caller[conn.caller]
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        conn.sock.close()


def _caller(sock: socket.socket) -> str:
    """Whose budget a connection counts against, from the kernel: its pod where it runs in one (a
    pod's root may become any uid), else its uid."""
    try:
        pid, uid, _ = peer_credentials(sock)
    except OSError:
        return "unknown"
    pod = kube_pod_uid(pid) if pid > 0 else None
    return f"pod:{pod}" if pod else f"uid:{uid}"


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
def attestation_service(
    pool: Pool, mps_daemon: Callable[[], Optional[Tuple[int, int]]] = lambda: None
) -> Iterator[Attributor]:
    """The node's attestation socket for as long as it serves, and the Attributor that trusts it
    (`mps_daemon`: the supervised MPS control daemon's pid and start time, whose descendants are the node's)."""
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
        yield Attributor(attestations, mps_daemon=mps_daemon)
    finally:
        listener.stop()
