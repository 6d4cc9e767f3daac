"""The queue methods of PoolClient behave alike on the embedded pool and over HTTP (a real server)."""

from __future__ import annotations

import time

import pytest
from waiting import connections_to, wait_until

from gpupool.core.errors import InvalidInput, NotFound
from gpupool.core.model import Claim, GpuRequest, Holder
from gpupool.core.queues import QueueSpec
from gpupool.pooling.devices.emulated import emulated_devices
from gpupool.workload.client.embedded import EmbeddedPoolClient
from gpupool.workload.client.http import HttpPoolClient


@pytest.fixture(params=["embedded", "http"])
def client(request, tmp_path):
    if request.param == "embedded":
        pool = EmbeddedPoolClient(tmp_path / "state", devices=emulated_devices("2x16GiB"))
    else:
        server = request.getfixturevalue("running_server")
        pool = HttpPoolClient(server.url, token=server.token)
    with pool:
        yield pool


def test_set_list_use_and_delete_a_queue(client):
    status = client.set_queue(QueueSpec("team-a", 1.0, weight=2.0))
    assert (status.spec.name, status.spec.quota, status.spec.weight, status.allocated) == ("team-a", 1.0, 2.0, 0)
    with pytest.raises(InvalidInput):
        client.set_queue(QueueSpec("team-b", 5.0))  # above the pool's 2 GPUs
    before_claim = time.time()
    lease = client.claim(Claim((GpuRequest(1, fraction=0.5),), queue="team-a", priority=2), Holder("me", 1, "h", ""))
    claimed = time.time()
    assert lease.queue == "team-a" and lease.priority == 2 and lease.preempted_at is None
    [queue] = client.queues()
    assert queue.spec.name == "team-a" and queue.allocated == pytest.approx(0.5) and queue.borrowed == 0
    started = time.monotonic()
    watched = client.watch(lease.id, 0.3)
    assert watched.id == lease.id and watched.preempted_at is None and time.monotonic() - started >= 0.25
    with pytest.raises(InvalidInput):
        client.delete_queue("team-a")  # it holds a lease
    time.sleep(0.3)  # GPU time to account (the workload)
    releasing = time.time()
    client.release(lease.id)
    released = time.time()
    with pytest.raises(NotFound):
        client.watch(lease.id, 0.3)
    rows = {row.key: row for row in client.usage(time.time() - 3600)}
    # half a GPU from within the claim call to within the release call: bounds no slow machine breaks
    assert rows["team-a"].leases == 1
    assert 0.5 * (releasing - claimed) - 0.001 <= rows["team-a"].gpu_seconds <= 0.5 * (released - before_claim) + 0.001
    assert {row.key for row in client.usage(time.time() - 3600, by="holder")} == {
        lease.holder.name
    }  # the token's name on a server
    client.delete_queue("team-a")
    assert client.queues() == []
    with pytest.raises(NotFound):
        client.delete_queue("team-a")


def test_a_watch_holds_back_neither_heartbeats_nor_close(running_server):
    """The runner watches in one thread and heartbeats in another with one client: the watch has a
    connection of its own, and close() ends it at once."""
    import threading

    from gpupool.core.errors import ServerUnreachable

    client = HttpPoolClient(running_server.url, token=running_server.token)
    lease = client.claim(Claim((GpuRequest(1, fraction=0.25),)), Holder("me", 1, "h", ""))
    ended = []

    def watch() -> None:
        try:
            client.watch(lease.id, 30)
            ended.append("answered")
        except ServerUnreachable:
            ended.append("cut")

    port = int(running_server.url.rsplit(":", 1)[1])
    before = connections_to(port)  # the claim's kept-alive connection
    thread = threading.Thread(target=watch)
    thread.start()
    # the watch under way, on a connection of its own (were it not yet, the heartbeat would pass anyway)
    wait_until(lambda: connections_to(port) > before, 30, "the watch connected to the server")
    started = time.monotonic()
    client.heartbeat(lease.id)
    # Had the watch held the heartbeat's connection, the heartbeat would have waited its 30 s.
    assert time.monotonic() - started < 20
    client.close()
    thread.join(20)  # close() cuts the watch; otherwise it would answer after its 30 s
    assert ended == ["cut"]
