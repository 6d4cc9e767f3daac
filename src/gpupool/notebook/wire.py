"""The Jupyter wire protocol, as far as the proxy reads it: frames are never altered.

A message is `[identities..., b"<IDS|MSG>", hmac, header, parent_header, metadata, content, buffers...]`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

DELIMITER = b"<IDS|MSG>"


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
