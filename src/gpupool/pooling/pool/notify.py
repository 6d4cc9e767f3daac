"""The pool's one notification path: a committed write tells the watches of the leases it changed.

Every transaction that changes what a lease's runner must act on (the lease ended, preempted, asked
to park, given room to restore) names the lease; after its commit the store hands the names to
`LeaseBoard.bump`, which wakes the watches of those leases in this process: a thread's
(`Subscription.wait`, the in-process client's watch) or an event loop's (`Subscription.wait_async`,
the server's long poll, which holds no thread). A bump of a lease nobody watches costs one dict
look-up, so the claim/release path pays nothing for it.

Writes made by other processes on the same state dir (embedded clients) reach no board of this
one: the watch re-reads the lease from SQLite at its fallback interval for those.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # asyncio only in the server's waits: a run's embedded pool never imports it
    import asyncio
    from types import TracebackType
    from typing import Dict, Iterable, Iterator, List, Optional, Tuple, Type


class LeaseBoard:
    """Per-lease change counters of the leases watched in this process, and the waits on them."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        # lease id -> (changes seen since its first watch, how many watch it); only watched leases
        self._watched: Dict[str, Tuple[int, int]] = {}
        # lease id -> the event loops' futures waiting on it (resolved by the next bump)
        self._futures: Dict[str, List[Tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        self._closed = False
        self._blocked = 0  # threads in Subscription.wait now

    @property
    def closed(self) -> bool:
        return self._closed

    def watch(self, lease_id: str) -> Subscription:
        """Follow `lease_id`'s changes until the subscription is closed (use it as a context manager)."""
        with self._cond:
            count, watchers = self._watched.get(lease_id, (0, 0))
            self._watched[lease_id] = (count, watchers + 1)
        return Subscription(self, lease_id)

    def bump(self, lease_ids: Iterable[str]) -> None:
        """The leases `lease_ids` changed (their transaction committed): wake their watches."""
        woken: List[Tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        with self._cond:
            changed = False
            for lease_id in lease_ids:
                entry = self._watched.get(lease_id)
                if entry is None:
                    continue  # nobody here watches it
                self._watched[lease_id] = (entry[0] + 1, entry[1])
                woken.extend(self._futures.pop(lease_id, ()))
                changed = True
            if changed:
                self._cond.notify_all()
        _resolve(woken)

    def close(self) -> None:
        """End every wait, now and later (the pool closes)."""
        with self._cond:
            self._closed = True
            woken = [waiter for waiters in self._futures.values() for waiter in waiters]
            self._futures.clear()
            self._cond.notify_all()
        _resolve(woken)

    def waiting(self) -> int:
        """How many waits (threads and futures) are blocked now: for tests, which release a lease
        once its watch waits, and for the curious."""
        with self._cond:
            return self._blocked + sum(len(futures) for futures in self._futures.values())

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        """Count a wait on something else (a doorbell, pool/doorbell.py) in `waiting`."""
        with self._cond:
            self._blocked += 1
        try:
            yield
        finally:
            with self._cond:
                self._blocked -= 1

    def _count(self, lease_id: str) -> int:
        return self._watched[lease_id][0]

    def _unwatch(self, lease_id: str) -> None:
        with self._cond:
            count, watchers = self._watched[lease_id]
            if watchers <= 1:
                del self._watched[lease_id]
                self._futures.pop(lease_id, None)
            else:
                self._watched[lease_id] = (count, watchers - 1)


class Subscription:
    """One watch of one lease on a `LeaseBoard`: read `seen()`, read the lease, then wait for a
    change after that count, so that no change between the read and the wait is missed."""

    def __init__(self, board: LeaseBoard, lease_id: str) -> None:
        self.board = board
        self.lease_id = lease_id
        self._open = True

    def seen(self) -> int:
        """The lease's change count now: take it before reading the lease."""
        with self.board._cond:
            return self.board._count(self.lease_id)

    def wait(self, seen: int, timeout_s: float) -> bool:
        """Block until the count moves past `seen` or the board closes (True), or `timeout_s` passes (False)."""
        board = self.board
        deadline = time.monotonic() + timeout_s
        with board._cond:
            board._blocked += 1
            try:
                while board._count(self.lease_id) == seen and not board._closed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    board._cond.wait(remaining)
                return True
            finally:
                board._blocked -= 1

    async def wait_async(self, seen: int, timeout_s: float) -> bool:
        """`wait` for a coroutine: the event loop runs on while it waits (no thread is held)."""
        import asyncio  # already loaded: this runs on an event loop

        board = self.board
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with board._cond:
            if board._count(self.lease_id) != seen or board._closed:
                return True
            board._futures.setdefault(self.lease_id, []).append((loop, future))
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
            return True
        except asyncio.TimeoutError:  # the builtin TimeoutError from Python 3.11 on
            with board._cond:
                waiters = board._futures.get(self.lease_id, [])
                if (loop, future) in waiters:
                    waiters.remove((loop, future))
            return future.done()

    def close(self) -> None:
        if self._open:
            self._open = False
            self.board._unwatch(self.lease_id)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self,
        kind: Optional[Type[BaseException]],
        value: Optional[BaseException],
        trace: Optional[TracebackType],
    ) -> None:
        self.close()


def _resolve(waiters: Iterable[Tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    """Resolve each future on its own loop (a bump comes from any thread)."""
    for loop, future in waiters:
        try:
            loop.call_soon_threadsafe(_set, future)
        except RuntimeError:  # its loop is closed: nobody waits any more
            pass


def _set(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
