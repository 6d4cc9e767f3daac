"""Riding out a pool server's outage: the clients' retry schedule and how long a restarted server
keeps a waiting claim's place for its client to come back. Pure: no I/O but os.urandom.

The two sides are one contract: a client retries at least every `RETRY_MAX_S` (a claim) or its
lease's TTL/3 (a heartbeat), and a restarted server keeps a waiting claim's ticket for
`TICKET_REATTACH_S`, well above the first, so a client that is still there always finds it.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Iterator

# The first retry after a failed request, and the cap of a waiting claim's retries (doubling between).
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 2.0
# Each pause is drawn from [1 - JITTER, 1] of its step, so the clients of a restarted server do not
# all come back in the same instant.
JITTER = 0.5
# A restarted server keeps the ticket of a claim that was waiting at the stop this long (from its
# start) for the client to re-attach with the claim's key; a client that never comes back loses it.
TICKET_REATTACH_S = 30.0
# A claim key (the client's name for one claim, sent with each try of it), also the OpenAPI
# document's pattern. `(?!\n)` is no-op in JSON Schema's (ECMA) regexes, but keeps Python's `$`
# (which also matches before a final newline) from letting a generator add one.
MIN_KEY_LEN = 16
MAX_KEY_LEN = 64
KEY_PATTERN = rf"^[A-Za-z0-9_-]{{{MIN_KEY_LEN},{MAX_KEY_LEN}}}(?!\n)$"
_KEY_RE = re.compile(KEY_PATTERN)


def backoff(cap_s: float, first_s: float = RETRY_FIRST_S) -> Iterator[float]:
    """Endless retry pauses: `first_s`, doubling up to `cap_s`, each with its jitter."""
    step = min(first_s, cap_s)
    while True:
        yield step * (1.0 - JITTER * _unit())
        step = min(step * 2.0, cap_s)


def new_key() -> str:
    """A fresh claim key: 128 random bits, as hex."""
    return os.urandom(16).hex()


def check_key(key: object) -> str:
    """`key` if it is a well-formed claim key, else ValueError naming it and the rule."""
    if not isinstance(key, str) or _KEY_RE.search(key) is None:
        shown = repr(key)[:80]
        raise ValueError(
            f"key {shown} must be {MIN_KEY_LEN} to {MAX_KEY_LEN} letters, digits, '-' or '_' "
            "(a random id the client picks per claim, e.g. 32 hex digits)"
        )
    return key


def _unit() -> float:
    """A uniform number in [0, 1) from os.urandom (the random module is heavy to import at every run)."""
    return int.from_bytes(os.urandom(2), "big") / 65536.0
