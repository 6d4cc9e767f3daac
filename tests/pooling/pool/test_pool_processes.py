"""Several processes on one state dir coordinate through SQLite only."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

from waiting import wait_until

from gpupool.core.model import Claim, Holder
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool


def _worker(state_dir: str, rounds: int, results) -> None:
    pool = Pool(state_dir)
    capacity = {d.uuid: d.memory_mib for d in pool.devices()}
    over = 0
    for _ in range(rounds):
        lease = pool.claim(Claim.single(1, fraction=0.4), Holder(f"p{os.getpid()}"), wait_s=30)
        used = pool.status().allocated()
        over += sum(1 for uuid, mib in used.items() if mib > capacity[uuid])
        pool.release(lease.id)
    results.put((rounds, over))


def _wait_forever(state_dir: str) -> None:
    pool = Pool(state_dir)
    pool.claim(Claim.single(2, fraction=1.0), Holder("doomed"), wait_s=600)


def test_processes_share_one_state_dir(tmp_path):
    Pool(tmp_path, devices=emulated_devices("2x16GiB", "n")).close()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), 15, results)) for _ in range(4)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    assert sum(r for r, _ in outcomes) == 60
    assert sum(o for _, o in outcomes) == 0
    assert Pool(tmp_path).status().leases == ()


def test_ticket_of_a_killed_waiter_leaves_the_queue(tmp_path):
    pool = Pool(tmp_path, devices=emulated_devices("2x16GiB", "n"))
    blocker = pool.claim(Claim.single(1, fraction=0.5), Holder("a"))
    proc = mp.get_context("spawn").Process(target=_wait_forever, args=(str(tmp_path),))
    proc.start()
    wait_until(lambda: pool.status().queued != 0, 30, "the other process's claim to queue")
    assert pool.status().queued == 1
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(5)
    # The dead waiter is noticed on the next state change and no longer blocks the queue.
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("b"))
    assert pool.status().queued == 0
    pool.release(lease.id)
    pool.release(blocker.id)
