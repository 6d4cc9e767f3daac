"""Bearer tokens: the admin token file, named tokens stored as hashes, and request identity.

Only the sha256 of a token is stored or kept in memory; tokens are compared
as hashes with `hmac.compare_digest`, so neither a DB dump nor response
timing gives a usable token away.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from ...core.errors import Forbidden, InvalidInput, NotFound, Unauthorized
from ...core.suspension import BY_ADMIN
from ...pooling.store import Store

if TYPE_CHECKING:
    from ...pooling.pool import Pool

log = logging.getLogger(__name__)

ADMIN_NAME = "admin"
LEGACY = "legacy"  # tokens.origin of a token made before origins were recorded
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"  # also the OpenAPI document's pattern
_NAME_RE = re.compile(NAME_PATTERN)
# How long a named-token lookup is trusted before the database is asked again:
# tokens created or revoked by another process take effect within this time.
CACHE_S = 5.0
# A token's last use is recorded to the minute: a write per request would cost every claim one.
LAST_USED_EVERY_S = 60.0


@dataclass(frozen=True)
class Identity:
    """Who sent a request: a token name, whether it may act on every lease, and the queue its
    claims go to ("" = any queue it names)."""

    name: str
    admin: bool
    queue: str = ""

    @property
    def requester(self) -> Optional[str]:
        """The `requester` argument of Pool.heartbeat/release: None means admin."""
        return None if self.admin else self.name


ANONYMOUS = Identity(ADMIN_NAME, True)


def new_token() -> str:
    return "gp_" + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_name(name: object) -> str:
    """`name` if it may name a token (any JSON value may arrive here); InvalidInput otherwise."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name == ADMIN_NAME:
        raise InvalidInput(
            f"token name {name!r} is not allowed: use 1-64 letters, digits, '_.@-', and not {ADMIN_NAME!r}"
        )
    return name


def load_or_create_token_file(path: Union[str, Path]) -> str:
    """The admin token in `path`, created (mode 0600, parent dirs too) when absent."""
    path = Path(path).expanduser()
    if path.is_file():
        token = path.read_text(encoding="utf-8").strip()
        if len(token) < 16:
            raise InvalidInput(f"token file {path} holds no token of at least 16 characters: delete it to regenerate")
        if path.stat().st_mode & 0o077:
            log.warning("token file %s is readable by others: chmod 600 %s", path, path)
        return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = new_token()
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    log.warning("created admin token file %s", path)
    return token


def create_token(
    store: Store, name: str, admin: bool = False, origin: str = "local", queue: str = "", replace: bool = False
) -> str:
    """Create the named token (`replace`: also over an existing one, which stops working); returns
    the token, whose hash alone is stored.

    `origin`: "api" when an admin token asked over HTTP, "local" when made in the state dir
    (`gpupool token create --state`: whoever may write pool.db is its admin already).
    `queue`: the one queue its claims may use ("" = any); the caller checks that it exists.
    """
    check_name(name)
    if queue and admin:
        raise InvalidInput(
            f"an admin token cannot be bound to queue {queue!r}: it may act on every lease; drop --admin or --queue"
        )
    token = new_token()
    with store.write() as tx:
        if not replace and tx.token_named(name) is not None:
            raise InvalidInput(
                f"token {name!r} exists already: pass --replace to replace it (its old token stops working), "
                f"`gpupool token rotate {name}` to renew it as it is, or choose another name"
            )
        tx.put_token(name, token_hash(token), admin, time.time(), origin, queue=queue)
    log.info("created %stoken %r%s", "admin " if admin else "", name, f" for queue {queue!r}" if queue else "")
    return token


def rotate_token(store: Store, name: str, origin: str = "local") -> str:
    """A new token for `name`, admin and queue as they were; the old one stops working. NotFound
    when there is no such token."""
    with store.read() as tx:
        known = tx.token_named(name)
    if known is None:
        raise NotFound(f"there is no token {name!r}: `gpupool token list` shows them")
    admin, _, queue = known
    return create_token(store, name, admin, origin, queue, replace=True)


@dataclass(frozen=True)
class TokenInfo:
    """What `gpupool token list` shows of a named token (never the token: only its hash is kept)."""

    name: str
    admin: bool
    origin: str
    queue: str
    created_at: float
    last_used: Optional[float]

    def to_dict(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "admin": self.admin,
            "origin": self.origin,
            "queue": self.queue,
            "created_at": self.created_at,
            "last_used": self.last_used,
        }


def list_tokens(store: Store) -> List[TokenInfo]:
    with store.read() as tx:
        return [TokenInfo(*row) for row in tx.token_list()]


def revoke_token(store: Store, name: str) -> None:
    """Delete the token called `name` (it stops working at once here, within CACHE_S elsewhere), and
    end the leases it holds in the same transaction: they could not be renewed any more, and their
    runners, told by their watch (pool.Pool.watch), end their commands now, not at a lost heartbeat."""
    with store.write() as tx:
        if not tx.delete_token(name):
            raise NotFound(f"there is no token {name!r}: `gpupool token list` shows them")
        ended = tx.end_leases_of(name, time.time(), "revoked", BY_ADMIN)
    log.info("revoked token %r%s", name, f"; its leases ended: {', '.join(ended)}" if ended else "")


def install_token(store: Store, name: str, token: str) -> bool:
    """Store a token made elsewhere (a Kubernetes Secret) under `name`, not admin; False when
    the table already holds it under that name. The node agent's way into the token table."""
    check_name(name)
    digest = token_hash(token)
    with store.read() as tx:
        known = tx.token_row(digest)
    if known is not None and known[0] == name and known[2] != LEGACY:
        return False
    with store.write() as tx:
        tx.put_token(name, digest, False, time.time(), "secret")
    return True


def legacy_tokens(store: Store) -> List[str]:
    """Names of tokens whose origin is unknown (made before gpupool recorded it): an
    authenticating server does not honour them, since a server without auth may have made them."""
    with store.read() as tx:
        return tx.legacy_tokens()


class Authenticator:
    """Turns an `Authorization` header into an Identity, or raises Unauthorized.

    Args:
        admin_token: the token of the token file (None: no admin token).
        store: where named tokens live (hashes only).
    """

    def __init__(self, admin_token: Optional[str], store: Optional[Store]) -> None:
        self._admin_hash = token_hash(admin_token) if admin_token else None
        self._store = store
        self._cache: Dict[str, Tuple[Optional[Identity], float]] = {}
        self._lock = threading.Lock()

    def identify(self, authorization: Optional[str]) -> Identity:
        if not authorization:
            raise Unauthorized("this pool needs a token: send 'Authorization: Bearer <token>' (gpupool token create)")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        digest = token_hash(token)
        if self._admin_hash is not None and hmac.compare_digest(digest, self._admin_hash):
            return ANONYMOUS
        identity = self._named(digest)
        if identity is None:
            raise Unauthorized(
                "the token is not valid for this pool: ask its admin for a new one (gpupool token create)"
            )
        return identity

    def forget(self) -> None:
        """Drop cached lookups (after a token was created or rotated here)."""
        with self._lock:
            self._cache.clear()

    def _named(self, digest: str) -> Optional[Identity]:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(digest)
        if hit is not None and now - hit[1] < CACHE_S:
            return hit[0]
        identity = None
        if self._store is not None:
            with self._store.read() as tx:
                row = tx.token_row(digest)
                queue = tx.token_queue(digest) if row else ""
                last_used = tx.token_last_used(digest) if row else None
            # A legacy token may come from a server that ran without auth, where anyone could mint one.
            identity = Identity(row[0], row[1], queue) if row and row[2] != LEGACY else None
            wall = time.time()
            if identity is not None and (last_used is None or wall - last_used >= LAST_USED_EVERY_S):
                with self._store.write() as tx:  # `token list` shows it: one write a minute per token
                    tx.touch_token(digest, wall, LAST_USED_EVERY_S)
        with self._lock:
            if len(self._cache) > 10000:  # bounded: random bad tokens must not grow memory
                self._cache.clear()
            self._cache[digest] = (identity, now)
        return identity


def require_queue(pool: Pool, name: str) -> None:
    """InvalidInput unless `pool` has a queue called `name` (a token is bound to an existing one)."""
    known = [q.spec.name for q in pool.queues()]
    if name not in known:
        raise InvalidInput(
            f"queue {name!r} does not exist: create it first (gpupool queue set {name} --quota GPUS); "
            f"queues: {', '.join(known) or 'none'}"
        )


def require_admin(identity: Identity, what: str) -> None:
    if not identity.admin:
        raise Forbidden(f"{what} needs an admin token; token {identity.name!r} is not one")
