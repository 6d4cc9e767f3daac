"""Keep a lease alive from a background thread while the workload runs.

Through an outage of the pool server it keeps trying, with backoff (core.outage) capped at its
interval, until the server answers or the command ends: a restarted server renews the leases
that were live when it stopped, so only a lease the server no longer knows is lost.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ...core.errors import GpupoolError, NotFound
from ...core.model import Lease
from ...core.outage import backoff
from ...logs import get_logger
from ..client.base import PoolClient

if TYPE_CHECKING:
    from typing import Callable, Optional

log = get_logger(__name__)


class Heartbeat(threading.Thread):
    """Heartbeats `lease_id` every `interval_s`; warns on failures, and loudly (or calls `on_lost`)
    when the lease is lost."""

    def __init__(
        self,
        client: PoolClient,
        lease_id: str,
        interval_s: float,
        warn: Callable[[str], None],
        on_lost: Optional[Callable[[str], None]] = None,
        on_beat: Optional[Callable[[], object]] = None,
        on_lease: Optional[Callable[[Lease], None]] = None,
    ) -> None:
        """`on_lost` (on this thread) replaces the loud warning when the lease is gone, with the
        pool's word on how it ended;
        `on_beat` runs after every beat, successful or not (housekeeping such as reaping);
        `on_lease` gets the lease each successful beat returns (it carries `preempted_at`)."""
        super().__init__(name=f"gpupool-heartbeat-{lease_id[:8]}", daemon=True)
        self.client = client
        self.lease_id = lease_id
        self.interval_s = max(interval_s, 0.05)
        self.warn = warn
        self.on_lost = on_lost
        self.on_beat = on_beat
        self.on_lease = on_lease
        self.lost = False
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=self.interval_s + 5)

    def run(self) -> None:
        failing = False
        pause = self.interval_s
        retries = backoff(self.interval_s)
        while not self._stop_event.wait(pause):
            pause = self.interval_s
            try:
                lease = self.client.heartbeat(self.lease_id)
                if self.on_lease is not None:
                    self.on_lease(lease)
                if failing:
                    self.warn(f"heartbeat to {self.client.address} works again: lease {self.lease_id} renewed")
                failing = False
                retries = backoff(self.interval_s)
            except NotFound as err:
                self.lost = True
                if self.on_lost is not None:
                    self.on_lost(err.message)
                    return
                self.warn(
                    f"WARNING: lease {self.lease_id} is LOST (expired or released on {self.client.address}); "
                    "the GPUs may be given to someone else while this command still runs. "
                    "Use a longer --ttl if the pool was unreachable for a while."
                )
                return
            except GpupoolError as err:
                if not failing:
                    self.warn(f"warning: heartbeat failed, retrying until the pool answers: {err.message}")
                failing = True
                pause = next(retries)
            except Exception as err:  # keep beating whatever a transport throws
                log.exception("heartbeat error")
                if not failing:
                    self.warn(f"warning: heartbeat failed, retrying until the pool answers: {err!r}")
                failing = True
                pause = next(retries)
            self._housekeeping()

    def _housekeeping(self) -> None:
        if self.on_beat is None:
            return
        try:
            self.on_beat()
        except Exception:  # housekeeping must never stop the heartbeats
            log.debug("on_beat failed", exc_info=True)
