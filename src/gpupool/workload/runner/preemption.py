"""Hear at once that the pool preempted the lease, or ended it, and stop the command for it.

A daemon thread long-polls `client.watch(lease_id, WATCH_S)` while the command runs; the
heartbeat's answer carries `preempted_at` too (the fallback when a watch is cut). The first
notice of a preemption, from either, stops the command's tree: SIGTERM, SIGKILL after the
lease's grace. The main thread, whose `child.wait()` then returns, releases the lease.

The end of the lease under the command comes the same way: a release (by its owner or an admin),
its token revoked or an expiry answers the watch with NotFound, whose message says how it ended and
who ended it (the pool's history), and the heartbeat's NotFound is the fallback. The first notice
calls `on_gone` once, on a thread of its own, as a preemption's stop.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ...core.errors import GpupoolError, NotFound, Unauthorized
from ...core.model import RESUMING, SUSPENDING, Lease
from ...logs import get_logger
from ..client.base import PoolClient

if TYPE_CHECKING:
    from typing import Callable, Optional

    from .suspender import Suspender

log = get_logger(__name__)

# One long poll's length: a server answers at once on a preemption, so this only bounds idle requests.
WATCH_S = 30.0
# After a failed watch (server restarting, network), the next try waits this long.
RETRY_S = 2.0
# The first watch goes out this long after the command started: one that ends sooner (a short
# job, `gpupool run -- true`) costs no second connection to the pool and no request, and a
# preemption meanwhile is seen by that first watch (it answers at once), this much later at most.
START_S = 0.1


def preemption_notice(lease: Lease, what: str) -> str:
    """The line that says `lease` was preempted and that `what` ("the command", "the replicas") is
    being stopped with its grace: one wording for `gpupool run` and the job supervisor."""
    by = f" of queue {lease.queue}" if lease.queue else ""
    return (
        f"lease {lease.id}{by} was preempted (another queue needs its quota back): "
        f"stopping {what} (SIGTERM, SIGKILL after {lease.preempt_grace_s:g}s)"
    )


class PreemptionWatch(threading.Thread):
    """Calls `stop_command(lease)` once, on a thread of its own, when `lease_id` is seen preempted;
    with a `suspender`, parks and restores the command when the pool asks (a preempted lease
    that is to be suspended is parked, not stopped). When the lease ends under the command, calls
    `on_gone(why)` once, likewise, with the pool's word on how it ended (`gone` keeps it)."""

    def __init__(
        self,
        client: PoolClient,
        lease_id: str,
        stop_command: Callable[[Lease], None],
        suspender: Optional[Suspender] = None,
        on_gone: Optional[Callable[[str], None]] = None,
    ) -> None:
        super().__init__(name=f"gpupool-watch-{lease_id[:8]}", daemon=True)
        self.client = client
        self.lease_id = lease_id
        self.stop_command = stop_command
        self.suspender = suspender
        self.on_gone = on_gone
        self.preempted: Optional[Lease] = None
        self.gone: Optional[str] = None
        self._stopper: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._stop_event = threading.Event()

    def notice(self, lease: Lease) -> None:
        """Act on a lease seen by anyone (the heartbeat too): the first preempted sighting stops the
        command, on a thread of its own, so neither the heartbeat nor a watch in flight holds it up."""
        if lease.preempted_at is None or (self.suspender is not None and lease.state == SUSPENDING):
            return  # a suspension, not a stop: the watch parks it
        with self._lock:
            if self.preempted is not None or self._stop_event.is_set():
                return
            self.preempted = lease
            self._stop_event.set()
            self._stopper = threading.Thread(
                target=self._stop_command, args=(lease,), name=f"gpupool-preempt-{self.lease_id[:8]}", daemon=True
            )
            self._stopper.start()

    def notice_gone(self, why: str) -> None:
        """Act on the end of the lease seen by anyone (the heartbeat's NotFound too): the first
        sighting calls `on_gone(why)` on a thread of its own; none after a preemption (the pool
        reaps a preempted lease after its grace) or once the run stopped the watch (its own release)."""
        with self._lock:
            if self.gone is not None or self.preempted is not None or self._stop_event.is_set():
                return
            self.gone = why
            self._stop_event.set()
            if self.on_gone is None:
                return
            self._stopper = threading.Thread(
                target=self._end_command,
                args=(self.on_gone, why),
                name=f"gpupool-ended-{self.lease_id[:8]}",
                daemon=True,
            )
            self._stopper.start()

    def stop(self) -> None:
        """End the loop; a watch in flight ends when the lease is released or the client closed."""
        with self._lock:
            self._stop_event.set()

    def join_stopper(self, timeout_s: float) -> None:
        """Wait for the stopping (SIGTERM, grace, SIGKILL) after a preemption or the lease's end to
        finish, if one began."""
        stopper = self._stopper
        if stopper is not None:
            stopper.join(timeout=timeout_s)

    def run(self) -> None:
        if self._stop_event.wait(START_S):
            return
        while not self._stop_event.is_set():
            started = time.monotonic()
            try:
                lease = self.client.watch(self.lease_id, WATCH_S)
            except NotFound as err:  # released, its token revoked, or expired: the pool says which
                self.notice_gone(err.message)
                return
            except Unauthorized as err:  # the token the lease was claimed with no longer works
                self.notice_gone(f"lease {self.lease_id} can no longer be renewed: {err.message}")
                return
            except Exception as err:  # a transport error: keep watching, the heartbeat is the fallback
                message = err.message if isinstance(err, GpupoolError) else repr(err)
                log.debug("watch of %s failed: %s", self.lease_id, message)
                self._stop_event.wait(RETRY_S)
                continue
            if self.suspender is not None and lease.state in (SUSPENDING, RESUMING):
                self._step(lease)
                continue
            if lease.preempted_at is not None:
                self.notice(lease)
                return
            # A server without long polls answers at once: do not turn that into a busy loop.
            self._stop_event.wait(max(0.0, WATCH_S - (time.monotonic() - started)))

    def _step(self, lease: Lease) -> None:
        """Park or restore, as the pool asks; a report that fails is repeated at the next sighting."""
        assert self.suspender is not None
        try:
            if lease.state == SUSPENDING:
                self.suspender.park(lease)
            else:
                self.suspender.restore(lease)
        except Exception as err:
            message = err.message if isinstance(err, GpupoolError) else repr(err)
            log.warning("lease %s: %s step not reported yet: %s", self.lease_id, lease.state, message)
            self._stop_event.wait(RETRY_S)

    def _stop_command(self, lease: Lease) -> None:
        try:
            self.stop_command(lease)
        except Exception:  # the main thread's release path ends the tree anyway
            log.exception("stopping the command after a preemption")

    @staticmethod
    def _end_command(on_gone: Callable[[str], None], why: str) -> None:
        try:
            on_gone(why)
        except Exception:  # as above
            log.exception("ending the command after its lease ended")
