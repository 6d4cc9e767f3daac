"""The pool service: claim / heartbeat / release / expire / queue, over the SQLite store (stdlib only)."""

from .service import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S, Pool, Waiter, poll_delays

__all__ = ["Pool", "Waiter", "DEFAULT_TTL_S", "MIN_TTL_S", "MAX_TTL_S", "poll_delays"]
