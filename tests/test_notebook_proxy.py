"""The kernel proxy with raw ZeroMQ on both sides (no Jupyter): identities, held requests, IOPub, heartbeats."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

zmq = pytest.importorskip("zmq")

from gpupool.notebook import wire  # noqa: E402
from gpupool.notebook.launch import internal_connection  # noqa: E402
from gpupool.notebook.proxy import KernelProxy  # noqa: E402

CHANNELS = ("shell", "iopub", "stdin", "control", "hb")


def ports() -> Dict[str, Any]:
    info: Dict[str, Any] = {"ip": "127.0.0.1", "transport": "tcp"}
    for channel in CHANNELS:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            info[f"{channel}_port"] = probe.getsockname()[1]
    return info


def url(info: Dict[str, Any], channel: str) -> str:
    port = info[channel + "_port"]
    return f"tcp://{info['ip']}:{port}" if info["transport"] == "tcp" else f"ipc://{info['ip']}-{port}"


def message(msg_type: str, content: Optional[Dict[str, Any]] = None) -> List[bytes]:
    header = json.dumps({"msg_id": msg_type, "msg_type": msg_type}).encode()
    return [wire.DELIMITER, b"sig", header, b"{}", b"{}", json.dumps(content or {}).encode()]


class Gate:
    def __init__(self) -> None:
        self.open = True
        self.statuses: List[str] = []
        self.asked: List[str] = []

    def admit(self, channel: str, header: Optional[Dict[str, Any]]) -> bool:
        self.asked.append(str((header or {}).get("msg_type")))
        return self.open

    def on_status(self, state: str) -> None:
        self.statuses.append(state)

    def parked(self) -> bool:
        return not self.open


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Any]:
    # the kernel's side as the provisioner writes it: abstract Unix sockets, no TCP port to race for
    front, back = ports(), internal_connection({"key": b"k"}, tmp_path / "kernel-gpupool.json")
    gate = Gate()
    proxy = KernelProxy(front, back, gate)
    proxy.start()
    context = zmq.Context()
    kernel = {c: context.socket(k) for c, k in (("shell", zmq.ROUTER), ("iopub", zmq.PUB), ("hb", zmq.REP))}
    for channel, sock in kernel.items():
        sock.bind(url(back, channel))
    client = {c: context.socket(k) for c, k in (("shell", zmq.DEALER), ("iopub", zmq.SUB), ("hb", zmq.REQ))}
    client["shell"].setsockopt(zmq.IDENTITY, b"frontend-1")
    client["iopub"].setsockopt(zmq.SUBSCRIBE, b"")
    for channel, sock in client.items():
        sock.connect(url(front, channel))
    for sock in (*kernel.values(), *client.values()):
        sock.rcvtimeo = 3000
    yield gate, proxy, kernel, client
    proxy.stop()
    for sock in (*kernel.values(), *client.values()):
        sock.close(linger=0)
    context.term()


def test_requests_replies_and_identities_pass_unaltered(rig: Any) -> None:
    gate, _, kernel, client = rig
    client["shell"].send_multipart(message("execute_request"))
    got = kernel["shell"].recv_multipart()
    assert got[1] == b"frontend-1" and got[2:] == message("execute_request"), "the client's identity is kept"
    kernel["shell"].send_multipart([got[0], got[1], *message("execute_reply")])
    assert client["shell"].recv_multipart() == message("execute_reply")
    assert gate.asked == ["execute_request"]


def test_a_held_request_goes_on_when_released_in_order(rig: Any) -> None:
    gate, proxy, kernel, client = rig
    gate.open = False
    client["shell"].send_multipart(message("execute_request"))
    client["shell"].send_multipart(message("kernel_info_request"))
    kernel["shell"].rcvtimeo = 300
    with pytest.raises(zmq.Again):
        kernel["shell"].recv_multipart()
    gate.open = True
    proxy.release()
    kernel["shell"].rcvtimeo = 3000
    assert wire.msg_type(kernel["shell"].recv_multipart()) == "execute_request"
    assert wire.msg_type(kernel["shell"].recv_multipart()) == "kernel_info_request"


def test_iopub_status_is_read_and_heartbeats_are_answered_while_parked(rig: Any) -> None:
    gate, proxy, kernel, client = rig
    ready = threading.Event()

    def publish() -> None:  # until the subscription has gone through the proxy
        while not ready.wait(0.05):
            kernel["iopub"].send_multipart([b"kernel.status", *message("status", {"execution_state": "busy"})])

    threading.Thread(target=publish, daemon=True).start()
    got = client["iopub"].recv_multipart()
    ready.set()
    assert wire.execution_state(got) == "busy" and "busy" in gate.statuses
    proxy.publish([b"stream.stderr", *message("stream", {"name": "stderr", "text": "waiting"})])
    while True:
        got = client["iopub"].recv_multipart()
        if wire.msg_type(got) == "stream":
            break
    client["hb"].send(b"ping")  # the kernel's REP echoes it
    assert kernel["hb"].recv() == b"ping"
    kernel["hb"].send(b"ping")
    assert client["hb"].recv() == b"ping"
    gate.open = False  # parked: the proxy answers, the kernel sees nothing
    client["hb"].send(b"ping2")
    assert client["hb"].recv() == b"ping2"
    kernel["hb"].rcvtimeo = 300
    with pytest.raises(zmq.Again):
        kernel["hb"].recv()


def test_the_kernel_side_is_abstract_sockets_in_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "kernel-gpupool.json"
    info = internal_connection({"key": b"secret", "kernel_name": "k"}, path)
    assert info["transport"] == "ipc" and info["ip"].startswith("@gpupool-kernel-")
    assert {info[f"{c}_port"] for c in CHANNELS} == {1, 2, 3, 4, 5}
    assert json.loads(path.read_text()) == info and info["key"] == "secret"
    assert path.stat().st_mode & 0o777 == 0o600, "it holds the key"
    assert internal_connection({}, tmp_path / "other.json")["ip"] != info["ip"], "each kernel its own names"
