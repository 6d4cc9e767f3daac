"""The attestation wire: how a runner proves to its node which process holds a lease (pure, no I/O).

A claim's answer carries a per-lease key and the node's socket path (`AttestTicket`). The runner
connects to that Unix socket and sends one line `{"lease_id": ..., "key": ...}`; the node takes
the caller's pid from the kernel (SO_PEERCRED), never from the line, and answers one line:
`{"attested": {"lease_id", "pid"}}` or the usual `{"error": {"code", "message"}}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import InvalidInput

if TYPE_CHECKING:
    from typing import Any, Dict, Mapping, Optional, Tuple

# One request line, newline included: a lease id and a 64-hex key fit many times over.
MAX_LINE_BYTES = 4096
# Seconds one connection may take from accept to its answer (a stalled caller is cut off).
CONNECTION_TIMEOUT_S = 2.0
# The node's attestation folder below its state dir (mounted read-only into pods) and the socket in it.
SOCKET_DIR = "attest"
SOCKET_NAME = "attest.sock"
# sockaddr_un.sun_path holds 108 bytes with its NUL: a longer socket path is bound and reached
# through its folder (/proc/self/fd/N/NAME).
SUN_PATH_MAX = 107
# The claim answer's field with the ticket.
TICKET_FIELD = "attest"
# Read from the runner's environment: the node's socket as the runner sees it (a pod mounts the
# node agent's folder there), instead of the path in the claim's answer.
SOCKET_ENV = "GPUPOOL_ATTEST_SOCKET"
# Read from the runner's environment: the seconds `gpupool run` (and a local job's supervisor) waits
# for a node that cannot take its attestation now (busy, restarting) before it gives up without
# starting the command (default ATTEST_WAIT_S).
ATTEST_WAIT_ENV = "GPUPOOL_ATTEST_WAIT"
ATTEST_WAIT_S = 30.0


@dataclass(frozen=True)
class AttestTicket:
    """What a claimant needs to attest its lease: the lease's key and the node socket's path."""

    key: str
    socket: str

    def to_dict(self) -> Dict[str, Any]:
        return {"key": self.key, "socket": self.socket}

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any]) -> Optional[AttestTicket]:
        """The ticket in a claim answer, or None when the server gave none (an older server)."""
        raw = answer.get(TICKET_FIELD)
        if not isinstance(raw, dict):
            return None
        key, path = raw.get("key"), raw.get("socket")
        return cls(key, path) if isinstance(key, str) and isinstance(path, str) and key else None


def request_line(lease_id: str, key: str) -> bytes:
    """The one line a runner sends."""
    return json.dumps({"lease_id": lease_id, "key": key}, separators=(",", ":")).encode() + b"\n"


def parse_request(line: bytes) -> Tuple[str, str]:
    """(lease id, key) of a request line; InvalidInput naming what is wrong."""
    if len(line) > MAX_LINE_BYTES:
        raise InvalidInput(f"the attestation line is over {MAX_LINE_BYTES} bytes: send one line of lease_id and key")
    try:
        body = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise InvalidInput(
            'the attestation line is not JSON: send {"lease_id": ID, "key": KEY} and a newline'
        ) from None
    if not isinstance(body, dict) or set(body) != {"lease_id", "key"}:
        raise InvalidInput('the attestation line must be exactly {"lease_id": ID, "key": KEY}')
    lease_id, key = body["lease_id"], body["key"]
    if not isinstance(lease_id, str) or not isinstance(key, str) or not lease_id or not key:
        raise InvalidInput("lease_id and key must be non-empty strings, as the claim's answer gave them")
    return lease_id, key


def answer_line(payload: Mapping[str, Any]) -> bytes:
    """One answer line."""
    return json.dumps(payload, separators=(",", ":")).encode() + b"\n"
