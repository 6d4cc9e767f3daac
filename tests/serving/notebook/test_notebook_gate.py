"""The notebook gate's decisions and the wire reader, without Jupyter or a pool: a stand-in client."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import pytest
from waiting import holds, wait_until

from gpupool.serving.notebook import wire
from gpupool.serving.notebook.gate import ACTIVE, PARKED, KernelGate


def frames(msg_type: str, content: Dict[str, Any], idents: Tuple[bytes, ...] = (b"client",)) -> List[bytes]:
    header = {"msg_id": "m1", "msg_type": msg_type}
    return [*idents, wire.DELIMITER, b"sig", json.dumps(header).encode(), b"{}", b"{}", json.dumps(content).encode()]


def test_the_wire_reader_finds_the_header_and_the_status() -> None:
    busy = frames("status", {"execution_state": "busy"}, idents=(b"kernel.x.status",))
    assert wire.msg_type(busy) == "status" and wire.execution_state(busy) == "busy"
    assert wire.execution_state(frames("stream", {"name": "stdout"})) is None
    assert wire.header([b"no", b"delimiter"]) is None and wire.execution_state([wire.DELIMITER, b"x", b"{"]) is None


class Client:
    """A pool of one lease: suspend parks it at once (or fails with `refuse`), resume after `room_after` s."""

    def __init__(self, refuse: str = "", room_after: float = 0.0) -> None:
        self.refuse, self.room_after = refuse, room_after
        self.state = "running"
        self.calls: List[str] = []
        self.resumed_at: Optional[float] = None

    def lease(self) -> Any:
        error = self.refuse if self.calls[-1:] == ["suspend"] and self.refuse else ""
        suspension = SimpleNamespace(error=error) if error or self.state != "running" else None
        return SimpleNamespace(
            id="L1",
            holder=SimpleNamespace(label="kernel:k:abc /nb.ipynb"),
            state=self.state,
            suspension=suspension,
            needs_runner=False,
            queue="team-a",
        )

    def status(self) -> Any:
        return SimpleNamespace(leases=[self.lease()])

    def suspend(self, lease_id: str, reason: str = "") -> Any:
        self.calls.append("suspend")
        if not self.refuse:
            self.state = "suspended"
        return self.lease()

    def resume(self, lease_id: str) -> Any:
        self.calls.append("resume")
        self.resumed_at = time.monotonic()
        return self.lease()

    def get_lease(self, lease_id: str) -> Any:
        if self.resumed_at is not None and time.monotonic() - self.resumed_at >= self.room_after:
            self.state, self.resumed_at = "running", None
        return self.lease()

    def queues(self) -> List[Any]:
        return [SimpleNamespace(spec=SimpleNamespace(name="team-a"), waiting=2)]


def gate_of(client: Client, idle_s: Optional[float] = 0.3) -> Tuple[KernelGate, List[str], threading.Event]:
    said: List[str] = []
    released = threading.Event()
    gate = KernelGate([client], "kernel:k:abc", idle_s, lambda text, parent: said.append(text), released.set)  # type: ignore[list-item]
    gate.start()
    return gate, said, released


def test_idle_suspends_a_request_resumes_and_waits_for_room() -> None:
    client = Client(room_after=1.5)
    # The idle clock runs from the start: 3 s, so that "busy" comes before it runs out however slow the machine.
    gate, said, released = gate_of(client, idle_s=3.0)
    try:
        wait_until(lambda: gate.state == ACTIVE, 30)
        gate.on_status("busy")
        holds(lambda: client.calls == [], 0.5, "a busy kernel is never suspended")  # time for a wrong suspend
        gate.on_status("idle")
        wait_until(lambda: gate.state == PARKED, 30)
        assert gate.parked() and client.calls == ["suspend"]
        assert not gate.admit("shell", {"msg_type": "execute_request"}), "the request waits for the resume"
        assert gate.admit("control", {"msg_type": "shutdown_request"}), "a shutdown never resumes"
        wait_until(released.is_set, 30)
        assert gate.state == ACTIVE and client.calls == ["suspend", "resume"]
        assert said[0] == "gpupool: waiting for the GPU: 2 ahead in queue team-a\n"
        assert said[1].startswith("gpupool: got the GPU after ")
        assert gate.admit("shell", {"msg_type": "execute_request"})
    finally:
        gate.stop()


def test_a_refused_suspend_is_said_once_and_not_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    client = Client(refuse="cuda-bindings is not installed")
    caplog.set_level("WARNING", logger="gpupool.serving.notebook.gate")
    gate, _, _ = gate_of(client, idle_s=0.2)
    try:
        wait_until(lambda: bool(gate.refused), 30)
        # three more idle limits and more: no second try
        holds(lambda: client.calls == ["suspend"] and gate.state == ACTIVE, 0.6, "one suspend tried, no second")
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "cuda-bindings is not installed" in lines[0]
        assert gate.admit("shell", {"msg_type": "execute_request"})
    finally:
        gate.stop()


def test_no_idle_limit_never_suspends() -> None:
    client = Client()
    gate, _, _ = gate_of(client, idle_s=None)
    try:
        wait_until(lambda: gate.state == ACTIVE, 30)
        holds(lambda: client.calls == [], 0.5, "no suspend without an idle limit")  # time for a wrong suspend
    finally:
        gate.stop()
