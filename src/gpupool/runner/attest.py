"""Prove to the pool's node that this process holds its lease (stdlib only).

The node's watchdog attributes a GPU process to a lease only through a runner it saw attest:
this process connects to the node's Unix socket and sends the lease's key; the node reads our
pid from the kernel (SO_PEERCRED), so our children are then counted against our lease. Not being
able to attest is not fatal (a pool on another host cannot see our processes anyway): one warning.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Callable, Optional

    from ..client.base import PoolClient
    from ..core.model import Lease


# A node busy with other callers' attestations ("unavailable") is asked again after these pauses.
BUSY_PAUSES_S = (0.25, 0.5, 1.0, 2.0)


class AttestFailed(Exception):
    """Why the node did not record the attestation (one line), and its error code if it answered one."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


def attest_lease(client: PoolClient, lease: Lease, warn: Callable[[str], None]) -> bool:
    """Attest `lease` for this process if its pool has a watchdog; warns once when that fails."""
    ticket = client.attest_ticket(lease.id)
    if ticket is None:  # the embedded pool: no watchdog to convince
        return False
    from ..core.attestation import SOCKET_ENV  # only here: the embedded pool's runs never load the protocol

    path = os.environ.get(SOCKET_ENV) or ticket.socket
    try:
        if not ticket.key:
            raise AttestFailed("the server's answer carried no attestation key (an older server)")
        if not path:
            raise AttestFailed(f"no socket path: set {SOCKET_ENV}")
        for pause in (*BUSY_PAUSES_S, None):
            try:
                attest(path, lease.id, ticket.key)
                break
            except AttestFailed as err:
                if err.code != "unavailable" or pause is None:
                    raise
                time.sleep(pause)
    except AttestFailed as err:
        warn(
            f"warning: lease {lease.id} is not attested to the pool's node ({err}): its watchdog cannot "
            "attribute this lease's processes (they count as unleased there)"
        )
        return False
    return True


def attest(path: str, lease_id: str, key: str, timeout_s: Optional[float] = None) -> int:
    """Send the lease's key on the node socket at `path` (`timeout_s`: the protocol's
    CONNECTION_TIMEOUT_S when None); returns the pid the node recorded."""
    import socket  # the embedded pool never attests: its runs do not pay for the import

    from ..core.attestation import CONNECTION_TIMEOUT_S, MAX_LINE_BYTES, SUN_PATH_MAX, request_line

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
        raise AttestFailed(f"{path}: {err.strerror or err}") from None
    finally:
        sock.close()
        if fd is not None:
            os.close(fd)
    try:
        body = json.loads(answer.split(b"\n", 1)[0].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise AttestFailed(f"{path} answered {answer[:80]!r}, not an attestation answer") from None
    if isinstance(body, dict) and isinstance(body.get("attested"), dict):
        return int(body["attested"].get("pid", 0))
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    raise AttestFailed(str(message or f"{path} answered {body!r}"), str(code or ""))
