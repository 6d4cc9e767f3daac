"""What crosses the wire at the edge of the API: request bodies parsed within limits, error answers.

Framework-free (the fast path and the routes both use it). Every JSON body is
read with a size limit and parsed with a depth limit, and text that SQLite
could not store (lone surrogates) is refused here, so bad input is a 4xx and
never reaches the store. An unexpected exception becomes a 500 whose body
names a request id that the server's log carries with the traceback; the
client never sees the exception's text.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any, Dict, List, Tuple

from ...core.errors import InvalidInput, TooLarge

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20  # a claim or a token request is a few hundred bytes
MAX_DEPTH = 32  # nesting of a claim body is 5 deep
_SURROGATE_HINTS = (b"\\ud", b"\\uD")


def check_size(size: int, max_bytes: int = MAX_BODY_BYTES) -> None:
    """TooLarge (413) when a body of `size` bytes is over the limit."""
    if size > max_bytes:
        raise TooLarge(f"the request body is over {max_bytes} bytes: a claim or token request is a small JSON object")


def json_object(raw: bytes, max_bytes: int = MAX_BODY_BYTES) -> Dict[str, Any]:
    """A request body that must be one JSON object (empty: {}), within the size and depth limits.

    InvalidInput (400) for anything else: not JSON, not UTF-8, nested deeper than
    MAX_DEPTH, text with lone surrogates; TooLarge (413) over `max_bytes` (the webhook's
    listener allows bigger bodies than the pool API: an AdmissionReview of a big pod).
    """
    check_size(len(raw), max_bytes)
    try:
        body = json.loads(raw or b"{}")
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as err:
        raise InvalidInput(f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise InvalidInput(f"the request body must be a JSON object, got {type(body).__name__}")
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _depth(body) > MAX_DEPTH:
        raise _too_deep()
    if any(hint in raw for hint in _SURROGATE_HINTS):
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput(
                "the request body holds a lone UTF-16 surrogate (such as \\ud800) in a string: send valid Unicode"
            ) from None
    return body


def _too_deep() -> InvalidInput:
    return InvalidInput(f"the request body is nested more than {MAX_DEPTH} levels deep: a claim is 5 deep")


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion; stops as soon as it passes MAX_DEPTH."""
    deepest = 0
    stack: List[Tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if level > deepest:
            deepest = level
            if deepest > MAX_DEPTH:
                return deepest
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item if isinstance(v, (dict, list)))
    return deepest


def internal_error(err: BaseException, method: str, path: str) -> Tuple[str, Dict[str, Any]]:
    """Log `err` with its traceback under a new request id; (request id, the 500's JSON body)."""
    request_id = secrets.token_hex(8)
    log.error("internal error, request id %s, %s %s", request_id, method, path, exc_info=err)
    message = f"internal error (request id {request_id}): the server's log has the details"
    return request_id, {"error": {"code": "internal", "message": message, "request_id": request_id}}
