"""The kernel proxy with raw ZeroMQ on both sides (no Jupyter): identities, held requests, IOPub, heartbeats,
and what it does with messages not signed by the key's holder."""

from __future__ import annotations

import json
import socket
import stat
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

zmq = pytest.importorskip("zmq")

from gpupool.serving.notebook import proxy as proxy_module  # noqa: E402
from gpupool.serving.notebook import wire  # noqa: E402
from gpupool.serving.notebook.launch import internal_connection, remove_sockets  # noqa: E402
from gpupool.serving.notebook.proxy import OVER_LIMIT, REPLAYED, UNSIGNED, KernelProxy  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
KEY = b"the-kernels-key"
SIGNER = wire.Signer(KEY)


def ports() -> Dict[str, Any]:
    info: Dict[str, Any] = {"ip": "127.0.0.1", "transport": "tcp", "key": KEY, "signature_scheme": "hmac-sha256"}
    for channel in CHANNELS:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            info[f"{channel}_port"] = probe.getsockname()[1]
    return info


def url(info: Dict[str, Any], channel: str) -> str:
    port = info[channel + "_port"]
    return f"tcp://{info['ip']}:{port}" if info["transport"] == "tcp" else f"ipc://{info['ip']}-{port}"


def message(
    msg_type: str, content: Optional[Dict[str, Any]] = None, session: str = "frontend", signer: Any = SIGNER
) -> List[bytes]:
    header = json.dumps({"msg_id": msg_type, "msg_type": msg_type, "session": session}).encode()
    parts = [header, b"{}", b"{}", json.dumps(content or {}).encode()]
    return [wire.DELIMITER, signer.sign(parts) if signer else b"", *parts]


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
    front = ports()
    back = internal_connection(front, tmp_path / "kernel-gpupool.json")
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
    remove_sockets(back)


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


def test_the_kernel_side_is_sockets_in_a_private_folder(tmp_path: Path) -> None:
    path = tmp_path / "kernel-gpupool.json"
    info = internal_connection({"key": b"secret", "kernel_name": "k"}, path)
    try:
        folder = Path(info["ip"]).parent
        assert info["transport"] == "ipc" and folder.name.startswith("gpupool-kernel-")
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, "no other user reaches the kernel's sockets"
        assert {info[f"{c}_port"] for c in CHANNELS} == {1, 2, 3, 4, 5}
        assert json.loads(path.read_text()) == info and info["key"] == "secret"
        assert path.stat().st_mode & 0o777 == 0o600, "it holds the key"
        other = internal_connection({}, tmp_path / "other.json")
        assert Path(other["ip"]).parent != folder, "each kernel its own folder"
        remove_sockets(other)
    finally:
        remove_sockets(info)
    assert not folder.exists()


def test_unsigned_forged_and_replayed_requests_are_dropped_not_asked_or_held(
    rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    gate, proxy, kernel, client = rig
    caplog.set_level("WARNING", logger="gpupool.serving.notebook.proxy")
    ready = threading.Event()

    def publish() -> None:  # a signed status from the kernel, until the subscription is through
        while not ready.wait(0.05):
            kernel["iopub"].send_multipart(
                [b"kernel.status", *message("status", {"execution_state": "idle"}, "kernel")]
            )

    threading.Thread(target=publish, daemon=True).start()
    captured = client["iopub"].recv_multipart()  # anyone may subscribe to IOPub: this is what they get
    ready.set()
    gate.open = False  # parked: a request that counted would be held, and ask the gate to resume
    client["shell"].send_multipart(message("execute_request", signer=None))
    client["shell"].send_multipart(message("execute_request", signer=wire.Signer(b"a guessed key")))
    client["shell"].send_multipart(captured[1:])  # the kernel's own signature, replayed
    client["shell"].send_multipart([wire.DELIMITER, b"x" * 64])  # no header at all
    wait_until(lambda: sum(proxy.dropped.values()) == 4, what="the proxy to drop all four")
    assert proxy.dropped == {UNSIGNED: 3, REPLAYED: 1}
    assert gate.asked == [] and proxy.held_bytes == 0, "the gate never heard of them"
    assert "execute_request" not in [wire.msg_type(f) for f in proxy._held["shell"]]
    client["shell"].send_multipart(message("execute_request"))  # the owner's: asked, held
    wait_until(lambda: gate.asked == ["execute_request"], what="the gate to be asked")
    gate.open = True
    proxy.release()
    assert wire.msg_type(kernel["shell"].recv_multipart()) == "execute_request", "only the owner's reached it"
    kernel["shell"].rcvtimeo = 300
    with pytest.raises(zmq.Again):
        kernel["shell"].recv_multipart()
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("dropped" in line and len(line) < 400 for line in lines), lines


def test_what_is_held_for_a_parked_kernel_is_bounded(rig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gate, proxy, kernel, client = rig
    monkeypatch.setattr(proxy_module, "HELD_MAX_MESSAGES", 3)
    monkeypatch.setattr(proxy_module, "HELD_MAX_BYTES", 10_000)
    gate.open = False
    for n in range(5):  # signed, so held: the count stops them
        client["shell"].send_multipart(message("execute_request", {"n": n}))
    wait_until(lambda: proxy.dropped[OVER_LIMIT] == 2, what="two over the count")
    assert len(proxy._held["shell"]) == 3 and proxy.held_bytes < 10_000
    gate.open = True
    proxy.release()
    got = [json.loads(kernel["shell"].recv_multipart()[-1])["n"] for _ in range(3)]
    assert got == [0, 1, 2] and proxy.held_bytes == 0
    gate.open = False
    client["shell"].send_multipart(message("execute_request", {"blob": "x" * 20_000}))  # the bytes stop it
    wait_until(lambda: proxy.dropped[OVER_LIMIT] == 3, what="one over the bytes")
    assert proxy.held_bytes == 0


def test_a_big_heartbeat_or_subscription_disconnects_its_sender(rig: Any) -> None:
    gate, proxy, kernel, client = rig
    context = zmq.Context.instance()
    stranger = context.socket(zmq.REQ)
    stranger.linger = 0
    stranger.rcvtimeo = 500
    stranger.connect(client["hb"].getsockopt(zmq.LAST_ENDPOINT).decode())
    stranger.send(b"x" * (proxy_module.SMALL_FRAME_MAX + 1))
    with pytest.raises(zmq.Again):
        stranger.recv()
    assert kernel["hb"].poll(300) == 0, "it never reached the kernel"
    stranger.close()
    client["hb"].send(b"ping")  # the frontend's heartbeat goes on
    assert kernel["hb"].recv() == b"ping"
