"""The Jupyter wire protocol, as far as the proxy reads it: frames are never altered.

A message is `[identities..., b"<IDS|MSG>", hmac, header, parent_header, metadata, content, buffers...]`;
the hmac is the hex digest, under the connection file's key, of header, parent_header, metadata
and content (not the buffers).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Union

DELIMITER = b"<IDS|MSG>"
SIGNED_PARTS = 4  # header, parent_header, metadata, content


class Signer:
    """Checks a message's signature under a kernel's `key` and `signature_scheme` (hmac-sha256)."""

    def __init__(self, key: Union[bytes, str], scheme: str = "hmac-sha256") -> None:
        self.key = key.encode() if isinstance(key, str) else bytes(key)
        algorithm = scheme[len("hmac-") :] if scheme.startswith("hmac-") else ""
        if algorithm not in hashlib.algorithms_available:
            raise ValueError(f"signature scheme {scheme!r}: use hmac-<hash>, e.g. hmac-sha256")
        self._mac = hmac.new(self.key, digestmod=algorithm)

    def sign(self, parts: List[bytes]) -> bytes:
        mac = self._mac.copy()
        for part in parts:
            mac.update(part)
        return mac.hexdigest().encode()

    def valid(self, frames: List[bytes]) -> bool:
        """Whether `frames` carry the signature of the key's holder. Without a key nothing is
        signed (jupyter_client's rule, and the kernel then takes any message): all are valid."""
        if not self.key:
            return True
        try:
            at = frames.index(DELIMITER)
        except ValueError:
            return False
        signature, parts = frames[at + 1 : at + 2], frames[at + 2 : at + 2 + SIGNED_PARTS]
        if not signature or len(parts) < SIGNED_PARTS:
            return False
        return hmac.compare_digest(signature[0], self.sign(parts))


def _part(frames: List[bytes], offset: int) -> Optional[Dict[str, Any]]:
    """The JSON dict `offset` frames after the delimiter, None when absent or not a dict."""
    try:
        index = frames.index(DELIMITER) + offset
        value = json.loads(frames[index])
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def header(frames: List[bytes]) -> Optional[Dict[str, Any]]:
    """The message's header, None for frames that are no Jupyter message."""
    return _part(frames, 2)


def session(frames: List[bytes]) -> str:
    """The session its sender named in the header ('' when none)."""
    found = header(frames)
    value = found.get("session", "") if found else ""
    return value if isinstance(value, str) else ""


def msg_type(frames: List[bytes]) -> str:
    found = header(frames)
    return str(found.get("msg_type", "")) if found else ""


def execution_state(frames: List[bytes]) -> Optional[str]:
    """'busy', 'idle' or 'starting' for an IOPub status message, else None."""
    if msg_type(frames) != "status":
        return None
    content = _part(frames, 5)
    state = content.get("execution_state") if content else None
    return state if isinstance(state, str) else None
