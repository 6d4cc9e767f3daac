"""The DRA plugin inside `gpupool kube agent --dra` as a real process: a kill -9 between prepare
and unprepare loses no lease, and the restarted agent still answers and releases it."""

from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from waiting import tail, wait_until

from .dra_stand_ins import DRIVER, ApiServer, Kubelet, resource_claim, result
from .test_agent_process import start_agent

NS, UID, NAME = "team-a", "0f3e2d1c-4b5a-4978-8695-a4b3c2d1e0f9", "trainer-gpu"


@pytest.fixture
def base(monkeypatch):
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # Unix socket paths must stay short
    api = ApiServer()
    (root / "kubeconfig").write_text(api.kubeconfig())
    monkeypatch.setenv("KUBECONFIG", str(root / "kubeconfig"))
    yield root, api
    api.stop()
    shutil.rmtree(root)


def dra_leases(agent) -> list:
    return [lease for lease in agent.status()["leases"] if lease["holder"]["label"].endswith(f":{UID}")]


def test_kill_9_between_prepare_and_unprepare_loses_no_lease(base):
    root, api = base
    api.add_claim(resource_claim(NS, NAME, UID, [result("gpu-0", "8Gi")]))
    flags = ("--dra", "--cdi-dir", str(root / "cdi"))
    agent = start_agent(root, *flags)
    kubelet = Kubelet()
    try:
        registration = root / "plugins_registry" / f"{DRIVER}-reg.sock"
        wait_until(registration.exists, 10, "the DRA registration socket", detail=lambda: tail(agent.log))
        kubelet.register(str(registration))
        first = kubelet.prepare((NS, UID, NAME)).claims[UID]
        assert first.error == ""
        [lease] = dra_leases(agent)
        assert api.slice_writes, "the agent published no ResourceSlice"

        agent.proc.send_signal(signal.SIGKILL)
        agent.proc.wait(timeout=10)
        agent = start_agent(root, *flags)
        wait_until(registration.exists, 10, "the DRA registration socket", detail=lambda: tail(agent.log))
        kubelet.register(str(registration))
        assert [x["id"] for x in dra_leases(agent)] == [lease["id"]]
        assert kubelet.prepare((NS, UID, NAME)).claims[UID] == first  # still known: same answer, same lease
        assert [x["id"] for x in dra_leases(agent)] == [lease["id"]]

        assert kubelet.unprepare((NS, UID, NAME)).claims[UID].error == ""
        assert dra_leases(agent) == []
        assert list((root / "cdi").glob("*.json")) == []
    finally:
        kubelet.close()
        agent.stop()
    assert not registration.exists() and not (root / "plugins" / DRIVER / "dra.sock").exists()
