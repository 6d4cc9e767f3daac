"""The watchdog: sample the pooled GPUs, attribute processes to leases, record usage, act on offenders.

Two rules, each with its own mode (kill, warn, off), and idle reclaim (idle.py):
- over share: a lease whose processes use more memory on a GPU than its slice
  there, for longer than the grace period; on an `mps` node also, at once, a lease's
  process that the driver lists outside MPS (outside_mps: its client found no daemon when
  its CUDA context was made, so no memory or SM limit holds it);
- unleased: a process on a pooled GPU that belongs to no live lease, for longer
  than the grace period (so a command still ending just after its release is spared); the
  node's own MPS server is none (attribution.py marks it, from the process table).

Each action is logged with the process's pid and uid (the driver's and the kernel's word), its lease,
the lease's holder (its pid and host marked as the client's word) and MiB, counted per reason, and
kept among the recent actions of the usage record that every view reads.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Deque, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ...core.isolation_mode import IsolationMode
from ...core.model import Lease
from ...core.usage import (
    EnforcementAction,
    EnforceMode,
    ProcessUsage,
    UsageReport,
    Violation,
    check_interval,
)
from ...pooling.devices.usage import UsageSampler
from ...pooling.isolation import proctree
from ...pooling.isolation.emulated_usage import usage_file
from ...pooling.pool import Pool
from .attest import node_attestations
from .attribution import Attributor
from .idle import IdleReclaim

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0
DEFAULT_GRACE_S = 5.0
# Between SIGTERM and SIGKILL: long enough to flush a checkpoint line, short enough to free the GPU.
TERM_GRACE_S = 2.0
RECENT_ACTIONS = 50

Terminate = Callable[[Iterable[int], float], List[int]]


@dataclass(frozen=True)
class WatchdogConfig:
    """How often to sample, and what to do about each violation."""

    interval_s: float = DEFAULT_INTERVAL_S
    over_share: EnforceMode = EnforceMode.KILL
    unleased: EnforceMode = EnforceMode.WARN
    grace_s: float = DEFAULT_GRACE_S
    term_grace_s: float = TERM_GRACE_S
    idle_suspend_s: Optional[float] = None  # the node's idle limit for leases without one (None: never)

    def __post_init__(self) -> None:
        check_interval(self.interval_s, "--usage-interval", 0.05, 3600.0)
        check_interval(self.grace_s, "--enforce-grace", 0.0, 86400.0)
        check_interval(self.term_grace_s, "SIGTERM grace", 0.0, 600.0)


class Watchdog:
    """Runs `step()` every `config.interval_s` in a thread between `start()` and `stop()`."""

    def __init__(
        self,
        pool: Pool,
        config: WatchdogConfig = WatchdogConfig(),
        sampler: Optional[UsageSampler] = None,
        attributor: Optional[Attributor] = None,
        clock: Callable[[], float] = time.time,
        terminate: Terminate = proctree.terminate,
    ) -> None:
        self.pool = pool
        self.config = config
        self.sampler = (
            sampler if sampler is not None else UsageSampler(pool.devices(), usage_file(pool.emulated_usage_file()))
        )
        # By default the node's one registry of the pool's state dir, which its attestation socket fills.
        self.attributor = attributor or Attributor(node_attestations(pool.state_dir))
        self.clock = clock
        self.terminate = terminate
        self._since: Dict[Tuple[Violation, str, str], float] = {}  # (reason, lease or pid, device) -> first seen
        self._acted: Set[Tuple[Violation, str, str]] = set()
        self._recent: Deque[EnforcementAction] = collections.deque(maxlen=RECENT_ACTIONS)
        self._totals: Dict[str, int] = {reason.value: 0 for reason in Violation}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.idle = IdleReclaim(pool, config.idle_suspend_s)

    # --- lifecycle -------------------------------------------------------------
    def start(self) -> Watchdog:
        self._thread = threading.Thread(target=self._loop, name="gpupool-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and close NVML; idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.interval_s + self.config.term_grace_s + 5)
            self._thread = None
        self.sampler.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.step()
            except Exception:  # one bad sample must not end the watch
                log.exception("watchdog step failed")
            self._stop.wait(max(self.config.interval_s - (time.monotonic() - started), 0.0))

    # --- one sample ----------------------------------------------------------------
    def step(self) -> UsageReport:
        """Sample, attribute, act, and record the usage report in the pool."""
        devices, processes = self.sampler.sample()
        now = self.clock()
        status = self.pool.status()
        leases = status.leases
        rows = self.attributor.attribute(processes, leases)
        current: Set[Tuple[Violation, str, str]] = set()
        for key, pids, mib, lease in self._violations(rows, leases, status.isolation.mode is IsolationMode.MPS):
            current.add(key)
            since = self._since.setdefault(key, now)
            # A process outside MPS has no cap at all: waiting would let it take the whole GPU.
            grace = 0.0 if key[0] is Violation.OUTSIDE_MPS else self.config.grace_s
            if now - since >= grace and key not in self._acted:
                self._act(key, pids, mib, lease, now)
                self._acted.add(key)
        # A violation that ended starts its grace period afresh if it comes back.
        for key in list(self._since):
            if key not in current:
                del self._since[key]
                self._acted.discard(key)
        self.idle.observe(rows, leases, now)
        report = UsageReport(now, tuple(devices), tuple(rows), tuple(self._recent), dict(self._totals))
        self.pool.record_usage(report)
        return report

    def _violations(
        self, rows: Sequence[ProcessUsage], leases: Sequence[Lease], mps: bool = False
    ) -> Iterable[Tuple[Tuple[Violation, str, str], List[int], int, Optional[Lease]]]:
        """(key, pids, MiB, lease) of each rule broken in this sample, for rules not switched off;
        `mps`: the node's isolation is MPS, so a lease's process outside it is uncapped."""
        if self.config.over_share is not EnforceMode.OFF and mps:
            by_id = {lease.id: lease for lease in leases}
            for r in rows:
                # Only a lease's process: the MPS server (also outside MPS) is the daemon's child,
                # below no attested runner, so never attributed to a lease. None: the driver did not say.
                if r.lease_id in by_id and r.mps_client is False:
                    key = (Violation.OUTSIDE_MPS, str(r.pid), r.device_uuid)
                    yield key, [r.pid], r.memory_mib, by_id[r.lease_id]
        if self.config.over_share is not EnforceMode.OFF:
            for lease in leases:
                for uuid, allowed in _slice_mib(lease).items():
                    mine = [r for r in rows if r.lease_id == lease.id and r.device_uuid == uuid]
                    used = sum(r.memory_mib for r in mine)
                    if used > allowed:
                        yield (Violation.OVER_SHARE, lease.id, uuid), [r.pid for r in mine], used, lease
        if self.config.unleased is not EnforceMode.OFF:
            for r in rows:
                if r.unleased:
                    yield (Violation.UNLEASED, str(r.pid), r.device_uuid), [r.pid], r.memory_mib, None

    def _act(
        self, key: Tuple[Violation, str, str], pids: List[int], mib: int, lease: Optional[Lease], now: float
    ) -> None:
        reason, _, uuid = key
        mode = self.config.unleased if reason is Violation.UNLEASED else self.config.over_share
        holder = lease.holder.describe() if lease is not None else ""
        targets = [pid for pid in pids if pid > 1 and pid != os.getpid()]  # never ourselves nor init
        for pid in pids:
            action = EnforcementAction(now, reason, mode, pid, uuid, mib, lease.id if lease else "", holder)
            self._recent.append(action)
            self._totals[reason.value] += 1
            log.warning(
                "watchdog %s; pid %d runs as %s (the kernel's word)%s",
                action.describe(),
                pid,
                _owner(pid),
                "" if pid in targets else " (spared: not killable)",
            )
        if mode is EnforceMode.KILL and targets:
            killed = self.terminate(targets, self.config.term_grace_s)
            if killed:
                log.warning("watchdog: pid(s) %s ignored SIGTERM and were killed", killed)


def _owner(pid: int) -> str:
    """'uid N' of process `pid` as the kernel has it (the owner of /proc/PID), or why not."""
    try:
        return f"uid {os.stat(f'/proc/{pid}').st_uid}"
    except OSError:
        return "an unknown uid (the process is gone)"


def _slice_mib(lease: Lease) -> Dict[str, int]:
    """MiB the lease may use on each of its GPUs (a lease may hold several slices of one GPU)."""
    allowed: Dict[str, int] = {}
    for s in lease.slices:
        allowed[s.device_uuid] = allowed.get(s.device_uuid, 0) + s.memory_mib
    return allowed
