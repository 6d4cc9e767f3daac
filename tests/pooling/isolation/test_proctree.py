"""isolation/proctree: /proc parsing, trees, lease and pod identity, and ending processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest
from waiting import wait_until

from gpupool.pooling.isolation.env import LEASE_ID_ENV
from gpupool.pooling.isolation.proctree import (
    ProcessInfo,
    alive,
    descendants,
    group_members,
    is_descendant,
    lease_id_of,
    process_table,
    read_process,
    terminate,
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")


def kill_all(procs: List[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=5)


def fake_proc(tmp_path: Path, pid: int, **files: str) -> str:
    folder = tmp_path / "proc" / str(pid)
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return str(tmp_path / "proc")


def test_stat_is_parsed_after_the_last_parenthesis(tmp_path):
    root = fake_proc(tmp_path, 4242, stat="4242 (evil) name) (x) S 7 4240 4240 0 -1 4194560 ...\n")
    assert read_process(4242, root) == ProcessInfo(pid=4242, ppid=7, pgid=4240)
    assert process_table(root) == {4242: ProcessInfo(4242, 7, 4240)}
    assert read_process(9999, root) is None


def test_process_table_sees_this_process():
    info = process_table()[os.getpid()]
    assert info == ProcessInfo(os.getpid(), os.getppid(), os.getpgrp())


def test_descendants_and_is_descendant_on_a_synthetic_table():
    table = {
        p.pid: p
        for p in [
            ProcessInfo(10, 1, 10),
            ProcessInfo(11, 10, 10),
            ProcessInfo(12, 11, 12),
            ProcessInfo(13, 1, 13),
            ProcessInfo(20, 21, 20),
            ProcessInfo(21, 20, 20),
        ]
    }
    assert descendants(10, table) == [11, 12]
    assert descendants(13, table) == []
    assert is_descendant(12, 10, table) and is_descendant(11, 10, table)
    assert not is_descendant(13, 10, table) and not is_descendant(10, 10, table)
    assert not is_descendant(20, 99, table)  # a ppid cycle (racy snapshot) ends, it does not loop
    assert sorted(descendants(20, table)) == [21]
    assert group_members(10, table) == [10, 11]


def test_descendants_of_real_processes():
    code = "import subprocess, sys; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); p.wait()"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        table = process_table()
        assert {child.pid, grandchild} <= set(descendants(os.getpid(), table))
        assert descendants(child.pid, table) == [grandchild]
        assert is_descendant(grandchild, os.getpid(), table)
    finally:
        terminate([child.pid, grandchild], 1.0)
        kill_all([child])


def test_lease_id_of_reads_the_start_environment():
    with_lease = subprocess.Popen(["sleep", "30"], env=dict(os.environ, **{LEASE_ID_ENV: "lease-abc"}))
    without = subprocess.Popen(["sleep", "30"], env={k: v for k, v in os.environ.items() if k != LEASE_ID_ENV})
    try:
        assert lease_id_of(with_lease.pid) == "lease-abc"
        assert lease_id_of(without.pid) is None
    finally:
        kill_all([with_lease, without])
    assert lease_id_of(with_lease.pid) is None  # gone


def test_alive_counts_zombies_as_dead():
    assert alive(os.getpid())
    proc = subprocess.Popen(["true"])
    try:
        wait_until(lambda: not alive(proc.pid), 30, "`true` to exit")  # exited, not yet waited for: a zombie
        assert Path(f"/proc/{proc.pid}").exists()
    finally:
        proc.wait()
    assert not alive(proc.pid)


def test_terminate_escalates_to_sigkill_for_a_process_that_ignores_sigterm():
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    polite = subprocess.Popen(["sleep", "60"])
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        started = time.monotonic()
        # A grace long enough for the polite one to go on SIGTERM on a busy machine.
        killed = terminate([stubborn.pid, polite.pid, stubborn.pid], grace_s=2.0)
        assert killed == [stubborn.pid]
        assert 2.0 <= time.monotonic() - started < 30  # the grace kept, then no hanging on
        assert stubborn.wait(timeout=30) == -signal.SIGKILL
        assert polite.wait(timeout=30) == -signal.SIGTERM
    finally:
        kill_all([stubborn, polite])


def test_terminate_skips_gone_foreign_and_zombie_processes():
    zombie = subprocess.Popen(["true"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        wait_until(lambda: Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 10)
        started = time.monotonic()
        # pid 1 and this process are never signalled; a zombie counts as gone at once (long before the grace).
        assert terminate([zombie.pid, gone.pid, 1, os.getpid()], grace_s=60) == []
        assert time.monotonic() - started < 30
    finally:
        zombie.wait()


STUBBORN_TREE = (
    # A group leader and its forked child, both ignoring SIGTERM: only SIGKILL ends them.
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "if os.fork() == 0:\n"
    "    time.sleep(60)\n"
    "    sys.exit(0)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_terminate_ends_a_whole_process_group():
    stubborn = subprocess.Popen(
        [sys.executable, "-c", STUBBORN_TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    polite = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        members = group_members(stubborn.pid)
        assert len(members) == 2, members
        started = time.monotonic()
        # A grace long enough for the polite group to go on SIGTERM on a busy machine.
        killed = terminate((), 2.0, groups=[stubborn.pid, polite.pid], reap=lambda: (stubborn.poll(), polite.poll()))
        took = time.monotonic() - started
        assert killed == [stubborn.pid]
        assert 2.0 <= took < 30  # the grace kept, then no hanging on
        assert stubborn.returncode == -signal.SIGKILL and polite.returncode is not None
        assert not any(alive(pid) for pid in members)
        assert not any(alive(pid) for pid in group_members(stubborn.pid) + group_members(polite.pid))
    finally:
        kill_all([stubborn, polite])


def test_terminate_never_signals_its_own_group_or_init():
    started = time.monotonic()
    assert terminate((), grace_s=60, groups=[os.getpgrp(), 1, 0]) == []
    assert time.monotonic() - started < 30  # nothing signalled: the grace is never waited
