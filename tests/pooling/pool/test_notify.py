"""The lease board (pool/notify.py): a bump wakes the watches of its lease, threads and event loops."""

from __future__ import annotations

import asyncio
import threading

from waiting import wait_until

from gpupool.pooling.pool.notify import LeaseBoard

# Waits that a bump must cut short: far longer than any loaded machine takes to deliver one.
LONG_S = 30.0
# The bound a woken wait must meet: generous, it only tells "woken" from "timed out".
WOKEN_WITHIN_S = 10.0


def bump_soon(board: LeaseBoard, lease_id: str, started: threading.Event) -> threading.Thread:
    """Bump `lease_id` from another thread once `started` is set (the waiter is about to wait)."""

    def run() -> None:
        started.wait(LONG_S)
        board.bump([lease_id])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_bump_wakes_the_thread_that_waits_on_its_lease():
    board = LeaseBoard()
    with board.watch("a") as sub:
        seen = sub.seen()
        started = threading.Event()
        bumper = bump_soon(board, "a", started)
        started.set()
        assert sub.wait(seen, LONG_S) is True  # woken by the bump: a timeout would return False
        assert sub.seen() == seen + 1
        bumper.join(LONG_S)


def test_a_bump_between_the_read_and_the_wait_is_not_missed():
    board = LeaseBoard()
    with board.watch("a") as sub:
        seen = sub.seen()
        board.bump(["a"])  # the lease changed after it was read, before the wait
        assert sub.wait(seen, LONG_S) is True
        assert asyncio.run(sub.wait_async(seen, LONG_S)) is True


def test_another_lease_s_bump_does_not_wake_it():
    board = LeaseBoard()
    with board.watch("a") as sub:
        seen = sub.seen()
        board.bump(["b"])
        assert sub.wait(seen, 0.05) is False and sub.seen() == seen


def test_a_lease_nobody_watches_leaves_nothing_behind():
    board = LeaseBoard()
    board.bump(["x"] * 3)
    assert board._watched == {}
    with board.watch("a"), board.watch("a") as second:
        board.bump(["a"])
        assert second.seen() == 1
    assert board._watched == {} and board._futures == {}


def test_close_ends_every_wait():
    board = LeaseBoard()
    with board.watch("a") as sub:
        seen = sub.seen()
        closer = threading.Timer(0.05, board.close)
        closer.start()
        assert sub.wait(seen, LONG_S) is True and board.closed
        closer.join()


def test_a_bump_from_a_thread_wakes_a_coroutine_and_the_loop_runs_on():
    board = LeaseBoard()

    async def main() -> tuple:
        ticks = 0
        with board.watch("a") as sub:
            seen = sub.seen()
            loop = asyncio.get_running_loop()
            waiting = asyncio.ensure_future(sub.wait_async(seen, LONG_S))
            while ticks < 3:  # the loop is not blocked by the wait
                await asyncio.sleep(0.01)
                ticks += 1
            bumper = loop.run_in_executor(None, board.bump, ["a"])
            woken = await asyncio.wait_for(waiting, WOKEN_WITHIN_S)
            await bumper
            return woken, ticks, dict(board._futures)

    woken, ticks, left = asyncio.run(main())
    assert woken is True and ticks == 3 and left == {}


def test_an_async_wait_times_out_and_forgets_its_future():
    board = LeaseBoard()

    async def main() -> bool:
        with board.watch("a") as sub:
            woken = await sub.wait_async(sub.seen(), 0.05)
            assert board._futures.get("a", []) == []
            return woken

    assert asyncio.run(main()) is False


def test_waiting_counts_the_blocked_threads_and_futures():
    board = LeaseBoard()
    with board.watch("a") as sub:
        seen = sub.seen()
        waiter = threading.Thread(target=sub.wait, args=(seen, LONG_S), daemon=True)
        waiter.start()
        wait_until(lambda: board.waiting() == 1, what="the thread to wait")
        board.bump(["a"])
        waiter.join(LONG_S)
        assert not waiter.is_alive() and board.waiting() == 0
