"""Waiting for a condition with a deadline, never for a duration: one helper for every test.

A test that sleeps and then asserts is slow where the machine is fast and
flaky where it is loaded (two cores shared by a CI run); polling a predicate
until a deadline is neither.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    what: str = "",
    *,
    interval: float = 0.05,
    detail: Optional[Callable[[], object]] = None,
) -> T:
    """Poll `predicate` until it returns something true, and return that; fail at the deadline.

    The predicate runs once more at the deadline, so a slow poll never fails a
    condition that holds; the failure names `what`, the last value seen and, with
    `detail`, what it returns then (a log's tail, the state the test waited on).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            more = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what or predicate!r}: last value {value!r}{more}"
            )
        time.sleep(interval)


def holds(
    predicate: Callable[[], object],
    seconds: float,
    what: str,
    *,
    checks: int = 5,
    interval: float = 0.05,
    detail: Optional[Callable[[], object]] = None,
) -> None:
    """Check that `predicate` stays true for `seconds` and at least `checks` looks; fail the first time it
    is not: "nothing wrong happens meanwhile" (no wrong grant, no rerun, no second try).

    The span is a floor, never measured: a loaded machine stretches it, and the count of looks keeps
    a test starved of CPU from passing on a single one.
    """
    deadline, looks = time.monotonic() + seconds, 0

    def look() -> bool:
        nonlocal looks
        value = predicate()
        if not value:
            more = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"no longer true after {looks} look(s): {what}: last value {value!r}{more}")
        looks += 1
        return looks >= checks and time.monotonic() >= deadline

    # wait_until's own limit never ends it: every look either fails or brings the end nearer
    wait_until(look, seconds + checks * interval + 600, what, interval=interval)


def connections_to(port: int) -> int:
    """Established TCP connections whose local end is `port` on this host (the server's side): calls a
    server holds open (long polls), seen without its help."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            count += state == "01" and int(local.rsplit(":", 1)[1], 16) == port  # 01: ESTABLISHED
    return count


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` has used (user + system, all its threads): its progress, which a
    loaded machine slows down as much as the process itself."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def wait_dead(pid: int, timeout: float = 15.0) -> None:
    """Wait until process `pid` has ended (a zombie counts as ended)."""
    from gpupool.pooling.isolation.proctree import alive

    wait_until(lambda: not alive(pid), timeout, f"process {pid} to end")


def tail(log: Path, chars: int = 3000) -> str:
    """The end of a log, for a failure message; '' while it does not exist."""
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


def wait_for_match(
    log: Path, pattern: str, proc: Optional[subprocess.Popen] = None, timeout: float = 60.0
) -> re.Match[str]:
    """Wait until `log` matches `pattern` (a child's "listening on URL" line); the match. Fails at once
    if `proc` ends first."""

    def found() -> Optional[re.Match[str]]:
        text = log.read_text(errors="replace") if log.exists() else ""
        match = re.search(pattern, text)
        if match is None and proc is not None:
            assert proc.poll() is None, f"it exited ({proc.returncode}) before {pattern!r}:\n{text[-3000:]}"
        return match

    return wait_until(found, timeout, f"{pattern!r} in {log}", detail=lambda: tail(log))


def events(log: Path) -> List[Dict[str, object]]:
    """The records of a JSON-lines event log (a test's child writes one per line); none before it exists."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def wait_for_events(log: Path, event: str, count: int = 1, timeout: float = 30.0) -> List[Dict[str, object]]:
    """Wait until `log` holds at least `count` records of `event`; those records."""

    def seen() -> Optional[List[Dict[str, object]]]:
        found = [e for e in events(log) if e["event"] == event]
        return found if len(found) >= count else None

    return wait_until(seen, timeout, f"{count} {event!r} event(s) in {log}", detail=lambda: events(log))
