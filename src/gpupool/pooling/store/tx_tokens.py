"""The token table (sha256 hashes only), inside one transaction (a part of `Tx`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .tx_base import TxBase

if TYPE_CHECKING:
    from typing import List, Optional, Tuple


class TokenTx(TxBase):
    """Tokens: put, look up, list, revoke, touch."""

    # --- tokens ---------------------------------------------------------------
    def put_token(
        self, name: str, token_hash: str, admin: bool, now: float, origin: str = "local", queue: str = ""
    ) -> None:
        """Create or replace the token called `name` (replacing rotates it); `origin` says who made it
        (schema.TOKEN_ORIGINS), `queue` the only queue it may claim in ("" = any)."""
        self.conn.execute("DELETE FROM tokens WHERE name = ? OR hash = ?", (name, token_hash))
        self.conn.execute(
            "INSERT INTO tokens (name, hash, admin, created_at, origin, queue) VALUES (?, ?, ?, ?, ?, ?)",
            (name, token_hash, int(admin), now, origin, queue),
        )

    def token_queue(self, token_hash: str) -> str:
        """The queue the token with this hash is bound to ("" = unbound, or no such token)."""
        row = self.conn.execute("SELECT queue FROM tokens WHERE hash = ?", (token_hash,)).fetchone()
        return str(row[0]) if row else ""

    def token_by_hash(self, token_hash: str) -> Optional[Tuple[str, bool]]:
        """(name, admin) of the token with this hash, or None."""
        row = self.token_row(token_hash)
        return (row[0], row[1]) if row else None

    def token_row(self, token_hash: str) -> Optional[Tuple[str, bool, str]]:
        """(name, admin, origin) of the token with this hash, or None."""
        row = self.conn.execute("SELECT name, admin, origin FROM tokens WHERE hash = ?", (token_hash,)).fetchone()
        return (row[0], bool(row[1]), str(row[2])) if row else None

    def token_list(self) -> List[Tuple[str, bool, str, str, float, Optional[float]]]:
        """(name, admin, origin, queue, created_at, last_used) of every named token, by name."""
        rows = self.conn.execute("SELECT name, admin, origin, queue, created_at, last_used FROM tokens ORDER BY name")
        return [
            (str(n), bool(a), str(o), str(q), float(c), None if u is None else float(u)) for n, a, o, q, c, u in rows
        ]

    def token_named(self, name: str) -> Optional[Tuple[bool, str, str]]:
        """(admin, origin, queue) of the token called `name`, or None."""
        row = self.conn.execute("SELECT admin, origin, queue FROM tokens WHERE name = ?", (name,)).fetchone()
        return (bool(row[0]), str(row[1]), str(row[2])) if row else None

    def token_last_used(self, token_hash: str) -> Optional[float]:
        row = self.conn.execute("SELECT last_used FROM tokens WHERE hash = ?", (token_hash,)).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def delete_token(self, name: str) -> bool:
        return self.conn.execute("DELETE FROM tokens WHERE name = ?", (name,)).rowcount > 0

    def touch_token(self, token_hash: str, now: float, every_s: float) -> None:
        """Record that the token authenticated at `now`, unless it did within `every_s`."""
        self.conn.execute(
            "UPDATE tokens SET last_used = ? WHERE hash = ? AND (last_used IS NULL OR last_used < ?)",
            (now, token_hash, now - every_s),
        )

    def legacy_tokens(self) -> List[str]:
        """Names of tokens with no recorded origin (made before schema 2)."""
        return [r[0] for r in self.conn.execute("SELECT name FROM tokens WHERE origin = 'legacy' ORDER BY name")]
