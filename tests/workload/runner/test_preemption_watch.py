"""The runner's preemption watch against a scripted client: one stop per preemption, from the
watch or the heartbeat's fallback, no busy loop against a server without long polls; one notice of
the lease's end (released, its token refused), with the pool's word on how it ended."""

from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional

import pytest

from gpupool.core.errors import NotFound, ServerUnreachable, Unauthorized
from gpupool.core.model import Holder, Lease
from gpupool.workload.runner import preemption
from gpupool.workload.runner.preemption import PreemptionWatch


def lease(preempted_at: Optional[float] = None) -> Lease:
    return Lease(
        id="lease-1",
        holder=Holder(name="a", pid=1, host="h"),
        slices=(),
        ttl_s=30.0,
        created_at=0.0,
        expires_at=30.0,
        queue="a",
        preempt_grace_s=1.0,
        preempted_at=preempted_at,
    )


class ScriptedClient:
    """`watch` answers with what `answer` returns for the n-th call (0-based)."""

    address = "scripted"

    def __init__(self, answer: Callable[[int], Lease]) -> None:
        self.answer = answer
        self.calls = 0

    def watch(self, lease_id: str, timeout_s: float) -> Lease:
        n = self.calls
        self.calls += 1
        return self.answer(n)


class Stops:
    def __init__(self) -> None:
        self.leases: List[Lease] = []
        self.threads: List[str] = []
        self.done = threading.Event()

    def __call__(self, seen: Lease) -> None:
        self.leases.append(seen)
        self.threads.append(threading.current_thread().name)
        self.done.set()


def test_a_preempted_answer_stops_the_command_once() -> None:
    stops = Stops()
    watch = PreemptionWatch(ScriptedClient(lambda n: lease(preempted_at=123.0)), "lease-1", stops)  # type: ignore[arg-type]
    watch.start()
    assert stops.done.wait(5)
    watch.join(5)
    watch.notice(lease(preempted_at=124.0))  # the heartbeat saw it too: no second stop
    watch.join_stopper(5)
    assert [s.preempted_at for s in stops.leases] == [123.0]
    assert watch.preempted is not None and watch.preempted.preempted_at == 123.0
    assert stops.threads[0].startswith("gpupool-preempt-")


def test_the_heartbeat_fallback_stops_it_while_a_watch_hangs() -> None:
    release = threading.Event()

    def hang(n: int) -> Lease:
        release.wait(120)
        return lease()

    stops = Stops()
    watch = PreemptionWatch(ScriptedClient(hang), "lease-1", stops)  # type: ignore[arg-type]
    watch.start()
    started = time.monotonic()
    watch.notice(lease())  # not preempted: nothing happens
    assert not stops.done.wait(0.2)
    watch.notice(lease(preempted_at=5.0))
    # stopped by the heartbeat's word, long before the hung watch (120 s) could have answered
    assert stops.done.wait(60) and time.monotonic() - started < 60
    release.set()
    watch.join(5)
    assert not watch.is_alive()
    assert len(stops.leases) == 1


def test_a_server_without_long_polls_is_not_polled_in_a_busy_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preemption, "WATCH_S", 0.5)
    client = ScriptedClient(lambda n: lease())  # answers at once, never preempted
    watch = PreemptionWatch(client, "lease-1", Stops())  # type: ignore[arg-type]
    watch.start()
    time.sleep(1.2)  # the span whose polls are counted (WATCH_S 0.5)
    watch.stop()
    watch.join(5)
    assert 2 <= client.calls <= 4


def test_errors_are_retried_and_a_gone_lease_ends_the_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preemption, "RETRY_S", 0.01)

    def flaky(n: int) -> Lease:
        if n < 3:
            raise ServerUnreachable("down")
        raise NotFound("lease 'lease-1' was released by an admin")

    client = ScriptedClient(flaky)
    stops, told = Stops(), Told()
    watch = PreemptionWatch(client, "lease-1", stops, on_gone=told)  # type: ignore[arg-type]
    watch.start()
    watch.join(5)
    assert not watch.is_alive() and client.calls == 4 and not stops.leases
    watch.join_stopper(5)
    # The pool's word on how it ended, once: the heartbeat's NotFound after it changes nothing.
    watch.notice_gone("lease 'lease-1' does not exist")
    assert told.whys == ["lease 'lease-1' was released by an admin"] == [watch.gone]
    assert told.threads[0].startswith("gpupool-ended-")


def test_a_refused_token_ends_the_lease_and_a_stopped_watch_hears_nothing() -> None:
    def refused(n: int) -> Lease:
        raise Unauthorized("the token is not valid for this pool")

    told = Told()
    watch = PreemptionWatch(ScriptedClient(refused), "lease-1", Stops(), on_gone=told)  # type: ignore[arg-type]
    watch.start()
    watch.join(5)
    watch.join_stopper(5)
    assert told.whys == ["lease lease-1 can no longer be renewed: the token is not valid for this pool"]
    # The run's own release, after it stopped the watch, is not an end to act on.
    stopped, quiet = PreemptionWatch(ScriptedClient(refused), "lease-2", Stops(), on_gone=Told()), Told()  # type: ignore[arg-type]
    stopped.on_gone = quiet
    stopped.stop()
    stopped.notice_gone("lease 'lease-2' was released by its owner ('a')")
    assert quiet.whys == [] and stopped.gone is None


def test_a_preempted_lease_reaped_later_is_not_a_second_stop() -> None:
    stops, told = Stops(), Told()
    watch = PreemptionWatch(ScriptedClient(lambda n: lease(preempted_at=1.0)), "lease-1", stops, on_gone=told)  # type: ignore[arg-type]
    watch.start()
    assert stops.done.wait(5)
    watch.join(5)
    watch.notice_gone("lease 'lease-1' was preempted and not released within its grace, so the pool reaped it")
    watch.join_stopper(5)
    assert len(stops.leases) == 1 and told.whys == [] and watch.gone is None


class Told:
    """An `on_gone` that records what it was told, and on which thread."""

    def __init__(self) -> None:
        self.whys: List[str] = []
        self.threads: List[str] = []

    def __call__(self, why: str) -> None:
        self.whys.append(why)
        self.threads.append(threading.current_thread().name)
