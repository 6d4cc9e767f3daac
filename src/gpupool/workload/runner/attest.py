"""Prove to the pool's node that this process holds its lease (stdlib only).

The node's watchdog attributes a GPU process to a lease only through a runner it saw attest:
this process connects to the node's Unix socket and sends the lease's key; the node reads our
pid from the kernel (SO_PEERCRED), so our children are then counted against our lease.

Where the node's socket is not on this machine (a pool on another host, which cannot see our
processes anyway) the run goes on with one warning. Where it is, a run that cannot attest fails
closed: it asks again while the node cannot answer now (busy, restarting), saying so once, for
at most ATTEST_WAIT_S; a node's refusal, or the end of that wait, raises NotAttested and the
command is never started (unattested, its processes would be killed or flagged as strangers).
"""

from __future__ import annotations

import errno
import json
import os
import time
from typing import TYPE_CHECKING

from ...core.errors import InvalidInput, NotAttested

if TYPE_CHECKING:
    from typing import Callable, Optional

    from ...core.model import Lease
    from ..client.base import PoolClient


# Pauses between the tries of a node that cannot take the attestation now; the last repeats.
RETRY_PAUSES_S = (0.1, 0.25, 0.5, 1.0)
# connect() errors that say the socket is not on this machine: the pool's node is another host.
_ELSEWHERE = (errno.ENOENT, errno.ENOTDIR)
# connect() errors that will not pass by waiting: the socket is here, but not ours to reach.
_REFUSED = (errno.EACCES, errno.EPERM, errno.ENOTSOCK)

ELSEWHERE, BUSY, REFUSED = "elsewhere", "busy", "refused"


class AttestFailed(Exception):
    """Why the node did not record the attestation (one line), its error code if it answered one,
    and what the runner makes of it: ELSEWHERE (no socket here), BUSY (ask again) or REFUSED."""

    def __init__(self, message: str, code: str = "", kind: str = REFUSED) -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind


def attest_lease(client: PoolClient, lease: Lease, warn: Callable[[str], None]) -> bool:
    """Attest `lease` for this process if its pool has a watchdog: True once the node recorded it,
    False (one warning) where no node of the pool is on this machine to record it; NotAttested
    where the node is here and did not record it, so the caller must not start its command."""
    ticket = client.attest_ticket(lease.id)
    if ticket is None:  # the embedded pool: no watchdog to convince
        return False
    from ...core.attestation import ATTEST_WAIT_ENV, ATTEST_WAIT_S, SOCKET_ENV  # the embedded pool never loads it

    path = os.environ.get(SOCKET_ENV) or ticket.socket
    wait_s = wait_seconds(os.environ.get(ATTEST_WAIT_ENV), ATTEST_WAIT_ENV, ATTEST_WAIT_S)
    deadline = time.monotonic() + wait_s
    told = False
    try:
        if not ticket.key:
            raise AttestFailed("the server's answer carried no attestation key (an older server)", kind=ELSEWHERE)
        if not path:
            raise AttestFailed(f"no socket path: set {SOCKET_ENV}", kind=ELSEWHERE)
        tries = 0
        while True:
            try:
                attest(path, lease.id, ticket.key)
                return True
            except AttestFailed as err:
                if err.kind != BUSY:
                    raise
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NotAttested(
                        f"lease {lease.id} could not be attested to the pool's node within {wait_s:g}s ({err}), "
                        "so the command was not started (unattested, its processes would count as unleased there): "
                        f"try again, or wait longer with {ATTEST_WAIT_ENV}=SECONDS"
                    ) from None
                if not told:
                    warn(
                        f"waiting up to {wait_s:g}s for the pool's node to take lease {lease.id}'s attestation "
                        f"({err}); the command starts once it has"
                    )
                    told = True
                time.sleep(min(RETRY_PAUSES_S[min(tries, len(RETRY_PAUSES_S) - 1)], left))
                tries += 1
    except AttestFailed as err:
        if err.kind == ELSEWHERE:
            warn(
                f"warning: lease {lease.id} is not attested to the pool's node ({err}): its watchdog cannot "
                "attribute this lease's processes (they count as unleased there)"
            )
            return False
        raise NotAttested(
            f"lease {lease.id} was not attested to the pool's node ({err}), so the command was not started "
            "(unattested, its processes would count as unleased there)"
        ) from None


def wait_seconds(raw: Optional[str], name: str, default: float) -> float:
    """The seconds in `raw` (the environment variable `name`), `default` when unset; InvalidInput
    naming the value otherwise."""
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 24 * 3600:  # also nan
        raise InvalidInput(f"{name}={raw[:40]!r} is not a number of seconds from 0 to 86400: set e.g. {name}=60")
    return value


def attest(path: str, lease_id: str, key: str, timeout_s: Optional[float] = None) -> int:
    """Send the lease's key on the node socket at `path` (`timeout_s`: the protocol's
    CONNECTION_TIMEOUT_S when None); returns the pid the node recorded."""
    import socket  # the embedded pool never attests: its runs do not pay for the import

    from ...core.attestation import CONNECTION_TIMEOUT_S, MAX_LINE_BYTES, SUN_PATH_MAX, request_line

    if timeout_s is None:
        timeout_s = CONNECTION_TIMEOUT_S

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd: Optional[int] = None
    try:
        sock.settimeout(timeout_s)
        address = path
        if len(os.fsencode(path)) > SUN_PATH_MAX:
            fd = os.open(os.path.dirname(path) or ".", os.O_PATH)
            address = f"/proc/self/fd/{fd}/{os.path.basename(path)}"
        sock.connect(address)
        try:
            sock.sendall(request_line(lease_id, key))
        except (BrokenPipeError, ConnectionResetError):
            pass  # a busy node answers at once and closes: its answer is still there to read
        answer = b""
        while b"\n" not in answer and len(answer) <= MAX_LINE_BYTES:
            chunk = sock.recv(MAX_LINE_BYTES)
            if not chunk:
                break
            answer += chunk
    except OSError as err:
        if err.errno in _ELSEWHERE:
            kind = ELSEWHERE
        elif err.errno in _REFUSED:
            kind = REFUSED
        else:  # refused (no server listening), timed out, backlog full, reset: a node restarting or busy
            kind = BUSY
        raise AttestFailed(f"{path}: {err.strerror or err}", kind=kind) from None
    finally:
        sock.close()
        if fd is not None:
            os.close(fd)
    try:
        body = json.loads(answer.split(b"\n", 1)[0].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        if not answer:  # closed unanswered: a node stopping
            raise AttestFailed(f"{path} closed the connection without an answer", kind=BUSY) from None
        raise AttestFailed(f"{path} answered {answer[:80]!r}, not an attestation answer") from None
    if isinstance(body, dict) and isinstance(body.get("attested"), dict):
        return int(body["attested"].get("pid", 0))
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    busy = code == "unavailable"  # the node's word for "not now": its own budget of this caller, or its cap
    raise AttestFailed(str(message or f"{path} answered {body!r}"), str(code or ""), BUSY if busy else REFUSED)
