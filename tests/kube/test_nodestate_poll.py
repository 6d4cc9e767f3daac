"""The webhook's and the extender's poll of the node agents goes through the pool's own client
(client.http): one kept-alive connection per agent across refreshes, closed when the agent leaves
the targets or the poll stops, and taken up again after the agent is killed and restarted."""

from __future__ import annotations

import signal
import socket
import urllib.parse
from pathlib import Path
from typing import Set

from envs import quiet_port

from gpupool.kube.nodestate import ClusterState


def client_ports(server_port: int) -> Set[int]:
    """Client ports of every TCP connection to 127.0.0.1:server_port the kernel still lists, from
    either end (TIME_WAIT included: the side that closed first keeps it): the connections made so far."""
    ports = set()
    server = f"0100007F:{server_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote = line.split()[1:3]
        if remote == server:
            ports.add(int(local.split(":")[1], 16))
        elif local == server and not remote.endswith(":0000"):
            ports.add(int(remote.split(":")[1], 16))
    return ports


def port_of(url: str) -> int:
    port = urllib.parse.urlsplit(url).port
    assert port is not None
    return port


def test_refreshes_reuse_one_connection_per_agent(server_factory):
    agent = server_factory()
    targets = {"node-a": agent.url}
    cluster = ClusterState(lambda: targets, token=agent.token or "")
    before = client_ports(port_of(agent.url))  # the fixture's own readiness probe
    try:
        for _ in range(6):
            cluster.refresh()
            assert [d.memory_mib for d in cluster.states()["node-a"].devices] == [16384, 16384]
        assert len(client_ports(port_of(agent.url)) - before) == 1  # urllib opened (and left in TIME_WAIT) 6
    finally:
        cluster.stop()


def test_an_agent_leaving_the_targets_loses_its_connection(server_factory):
    agent = server_factory()
    targets = {"node-a": agent.url}
    cluster = ClusterState(lambda: dict(targets), token=agent.token or "")
    before = client_ports(port_of(agent.url))
    cluster.refresh()
    (port,) = client_ports(port_of(agent.url)) - before
    targets.clear()
    cluster.refresh()
    assert "node-a" not in cluster.states()
    # Closed by the poll: the client side now sits in FIN_WAIT/TIME_WAIT, no longer ESTABLISHED (01).
    states = {
        line.split()[3]
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
        if line.split()[1] == f"0100007F:{port:04X}"
    }
    assert "01" not in states


def test_the_poll_takes_up_an_agent_killed_and_restarted_on_its_port(server_factory, tmp_path):
    port = quiet_port()
    state = tmp_path / "agent"
    agent = server_factory("--listen", f"127.0.0.1:{port}", state=state)
    cluster = ClusterState(lambda: {"node-a": agent.url}, token=agent.token or "", max_age_s=0.0)
    try:
        cluster.refresh()
        assert "node-a" in cluster.states()
        agent.stop(signal.SIGKILL)
        cluster.refresh()
        assert "node-a" not in cluster.states()  # down: unknown, not stale
        again = server_factory("--listen", f"127.0.0.1:{port}", state=state)
        assert again.url == agent.url
        cluster.refresh()
        assert "node-a" in cluster.states()
    finally:
        cluster.stop()


def test_a_wrong_token_is_an_agent_not_answering(server_factory):
    agent = server_factory()
    cluster = ClusterState(lambda: {"node-a": agent.url}, token="not-the-token")
    cluster.refresh()
    assert "node-a" not in cluster.states()
    with socket.create_connection(("127.0.0.1", port_of(agent.url))):
        pass  # the agent still serves: only this poll was refused


def test_an_assumed_bind_counts_until_the_pod_list_shows_it():
    from gpupool.core.model import Claim, Device

    gpu = Device("GPU-a-0", 0, "Test GPU", 10000, "node-a")
    claim = Claim.single(1, fraction=0.5)
    listed: dict = {}
    now = [100.0]
    status = {"devices": [gpu.to_dict() | {"allocated_mib": 0}], "leases": []}
    freed = []
    cluster = ClusterState(
        lambda: {"node-a": "http://agent"},
        fetch=lambda url: status,
        pending=lambda: listed,
        clock=lambda: now[0],
        freed=lambda: freed.append(now[0]) or True,
    )
    cluster.refresh()
    assert len(freed) == 1  # a node new to it: room
    cluster.assume("node-a", "uid-1", claim)
    assert cluster.states()["node-a"].allocated == {"GPU-a-0": 5000}  # at once, before any refresh
    cluster.refresh()  # listed before the bind: the list does not show it yet
    assert cluster.states()["node-a"].allocated == {"GPU-a-0": 5000}
    listed["node-a"] = [("uid-1", claim)]
    cluster.refresh()  # the list has it now: counted once, not twice
    assert cluster.states()["node-a"].allocated == {"GPU-a-0": 5000}
    assert len(freed) == 1  # nothing freed since
    listed.clear()  # the pod is gone: nothing is left of the assumed bind
    cluster.refresh()
    assert cluster.states()["node-a"].allocated == {"GPU-a-0": 0}
    assert len(freed) == 2  # told once the refresh has the room: the extender's word is fresh
    status["devices"][0]["allocated_mib"] = 0
    busy = [False]
    cluster._freed = lambda: freed.append(now[0]) or not busy[0]
    busy[0] = True  # "not now": told again after each refresh until it answers done
    status["devices"][0]["allocated_mib"] = 1000
    cluster.refresh()
    status["devices"][0]["allocated_mib"] = 0
    cluster.refresh()
    cluster.refresh()
    assert len(freed) == 4
    busy[0] = False
    cluster.refresh()
    cluster.refresh()
    assert len(freed) == 5
    cluster.assume("node-a", "uid-2", claim)  # bound, then deleted at once: forgotten after max_age_s
    now[0] += 31
    cluster.refresh()
    assert cluster.states()["node-a"].allocated == {"GPU-a-0": 0}
