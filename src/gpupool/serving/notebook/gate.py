"""The lease of one kernel: suspend it after idle time, resume it before the next request.

The proxy tells the gate each IOPub status and asks it about each shell and control request.
One worker thread does every call to the pool (so a suspend and a resume never cross): it finds
the lease by its label, suspends it once the kernel has been idle for `idle_suspend_s` with no
request in flight, and resumes it when a request waits. While the lease waits for room the
waiting cell gets one line on stderr, a stream message signed with the kernel's own key.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ...core.errors import GpupoolError, NotFound
from ...core.suspension import RUNNING, SUSPENDED, SUSPENDING
from ...logs import get_logger

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional

    from ...core.model import Lease
    from ...workload.client.base import PoolClient

log = get_logger(__name__)

TICK_S = 0.1
FIND_EVERY_S = 0.5
# While active the lease is read this often: someone else (the owner's `gpupool suspend`, a
# queue's preemption, the node's idle reclaim) may have parked it.
WATCH_EVERY_S = 1.0
# A resume still waiting this long is shown to the cell ("waiting for the GPU ...").
SHOW_WAIT_AFTER_S = 1.0
STEP_TIMEOUT_S = 120.0

# The gate's view of the lease.
STARTING, ACTIVE, PARKING, PARKED, WAKING, GONE = "starting", "active", "parking", "parked", "waking", "gone"


class KernelGate(threading.Thread):
    """Suspends and resumes the lease labelled `label` of one of `clients`."""

    def __init__(
        self,
        clients: List[PoolClient],
        label: str,
        idle_suspend_s: Optional[float],
        say: Callable[[str, Optional[Dict[str, Any]]], None],
        release: Callable[[], None],
    ) -> None:
        super().__init__(name="gpupool-kernel-gate", daemon=True)
        self.clients = clients
        self.label = label
        self.idle_suspend_s = idle_suspend_s
        self.say = say  # a stderr line to the cell whose request waits (its header), or None
        self.release = release  # the proxy asks again about the requests it holds
        self.client: Optional[PoolClient] = None
        self.lease_id: Optional[str] = None
        self.state = STARTING
        self.refused = ""  # why suspend cannot work here: idle then releases nothing
        self._lock = threading.Lock()
        self._busy = False
        self._quiet_since = time.monotonic()  # the last idle status, or request let through
        self._waiting: Optional[Dict[str, Any]] = None  # header of the first request held
        self._in_flight: Optional[Dict[str, Any]] = None  # a request let through, no status since
        self._watched = 0.0
        self._halt = threading.Event()

    # The proxy's thread.
    def on_status(self, state: str) -> None:
        with self._lock:
            self._busy = state == "busy"
            self._in_flight = None
            if state == "idle":
                self._quiet_since = time.monotonic()

    def admit(self, channel: str, header: Optional[Dict[str, Any]]) -> bool:
        """Whether a request goes to the kernel now; False: it waits for the resume begun here."""
        with self._lock:
            if self.state in (STARTING, ACTIVE, GONE) or (header or {}).get("msg_type") == "shutdown_request":
                self._quiet_since = time.monotonic()  # in flight: no suspend before its busy
                if self.state == ACTIVE:
                    self._in_flight = header or {}
                return True
            if self._waiting is None:
                self._waiting = header
            return False

    def parked(self) -> bool:
        return self.state in (PARKING, PARKED, WAKING)

    # The gate's own thread.
    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.wait(TICK_S):
            try:
                self._step()
            except Exception:  # the kernel goes on; the lease stays as it is
                log.exception("gpupool kernel gate: %s", self.label)
                self._halt.wait(1.0)

    def _step(self) -> None:
        if self.state == STARTING:
            self._find()
        elif self.state in (PARKED, PARKING) and self._waiting is not None:
            self._resume()
        elif self.state == ACTIVE and self._idle_long_enough():
            self._suspend()
        elif self.state == ACTIVE and time.monotonic() - self._watched >= WATCH_EVERY_S:
            self._watch()

    def _watch(self) -> None:
        """Notice a suspension made elsewhere: requests then wait, and one sent meanwhile (no
        status from the kernel since) has the gate resume the lease."""
        assert self.client is not None and self.lease_id is not None
        self._watched = time.monotonic()
        try:
            lease = self.client.get_lease(self.lease_id)
        except NotFound:
            with self._lock:
                self.state = GONE
            return
        if lease.state in (SUSPENDING, SUSPENDED):
            with self._lock:
                self.state = PARKED
                if self._in_flight is not None and self._waiting is None:
                    self._waiting = self._in_flight
            log.info("kernel %s: lease %s was suspended (%s)", self.label, self.lease_id, lease.state)

    def _find(self) -> None:
        for client in self.clients:
            for lease in client.status().leases:
                if lease.holder.label.split(" ", 1)[0] == self.label:
                    self.client, self.lease_id = client, lease.id
                    with self._lock:
                        self.state = ACTIVE
                        self._quiet_since = time.monotonic()
                    log.info("kernel %s holds lease %s", self.label, lease.id)
                    return
        self._halt.wait(FIND_EVERY_S)

    def _idle_long_enough(self) -> bool:
        if self.idle_suspend_s is None or self.refused:
            return False
        with self._lock:
            return not self._busy and time.monotonic() - self._quiet_since >= self.idle_suspend_s

    def _suspend(self) -> None:
        with self._lock:
            if self._busy or self._waiting is not None:
                return
            self.state = PARKING  # from now on requests wait for the resume
        assert self.client is not None and self.lease_id is not None
        try:
            self.client.suspend(self.lease_id, f"kernel idle for {self.idle_suspend_s:g}s")
            lease = self._await(lambda lease: lease.state == SUSPENDED)
        except GpupoolError as err:
            self._refuse(err.message)
            return
        if lease is None:  # gone (the kernel ended) or stopping: let held requests through
            self.release()
            return
        with self._lock:
            self.state = PARKED
        log.info("kernel %s: lease %s suspended after %gs idle", self.label, self.lease_id, self.idle_suspend_s)

    def _resume(self) -> None:
        assert self.client is not None and self.lease_id is not None
        with self._lock:
            self.state = WAKING
            parent = self._waiting
        started = time.monotonic()
        shown = False

        def running(lease: Lease) -> bool:
            nonlocal shown
            if not shown and lease.state == SUSPENDED and time.monotonic() - started >= SHOW_WAIT_AFTER_S:
                shown = True
                self.say(self._wait_line(lease), parent)
            return lease.state == RUNNING

        try:
            self.client.resume(self.lease_id)
        except GpupoolError as err:  # resuming already (a preemption's): wait for it all the same
            log.info("kernel %s: resume: %s", self.label, err.message)
        try:
            lease = self._await(running, timeout_s=None)
        except GpupoolError as err:
            self.say(f"gpupool: the GPU could not be resumed ({err.message}); the cell runs on anyway\n", parent)
            lease = None
        with self._lock:
            self.state = ACTIVE if lease is not None else self.state
            if self.state == WAKING:
                self.state = GONE  # the resume failed: let requests through, not hold them for ever
            self._waiting = None
            self._quiet_since = time.monotonic()
        if shown:
            self.say(f"gpupool: got the GPU after {time.monotonic() - started:.1f}s\n", parent)
        self.release()

    def _await(self, done: Callable[[Lease], bool], timeout_s: Optional[float] = STEP_TIMEOUT_S) -> Optional[Lease]:
        """The lease once `done` says so; None when it is gone or the runner's step failed."""
        assert self.client is not None and self.lease_id is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._halt.is_set():
            try:
                lease = self.client.get_lease(self.lease_id)
            except NotFound:
                with self._lock:
                    self.state = GONE
                return None
            if done(lease):
                return lease
            error = lease.suspension.error if lease.suspension is not None else ""
            if error and not lease.needs_runner:
                raise GpupoolError(error)
            if deadline is not None and time.monotonic() > deadline:
                raise GpupoolError(f"lease {self.lease_id} is still {lease.state} after {timeout_s:g}s")
            self._halt.wait(TICK_S)
        return None

    def _refuse(self, why: str) -> None:
        """Suspend cannot work here: say so once; the kernel keeps its lease while idle."""
        self.refused = why
        log.warning("kernel %s: idle suspend releases nothing: %s", self.label, why)
        with self._lock:
            if self.state == PARKING:
                self.state = ACTIVE
            self._waiting = None
        self.release()

    def _wait_line(self, lease: Lease) -> str:
        """'waiting for the GPU: N ahead in queue Q' (N: the claims waiting in the lease's queue)."""
        assert self.client is not None
        name = lease.queue or "default"
        ahead = 0
        try:
            ahead = next((q.waiting for q in self.client.queues() if q.spec.name == name), 0)
        except GpupoolError:
            pass
        return f"gpupool: waiting for the GPU: {ahead} ahead in queue {name}\n"
