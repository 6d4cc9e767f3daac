"""Issue 34 (4): another local user, without the kernel's key, cannot wake, keep or grow a gpupool kernel.

The frontend's ports (loopback TCP, bound by the proxy) are reachable by every uid on the host;
the kernel's own Unix sockets are listed to every uid but reachable only by its owner. A child
setuid to STRANGER_UID sends unsigned, badly signed and replayed (kernel-signed, captured from
IOPub) Jupyter messages to what it can reach; the kernel's owner uses jupyter_client with the
key, as a frontend does.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

from jupyter_client.manager import KernelManager

from gpupool.serving.notebook.gate import WAKING
from gpupool.serving.notebook.proxy import REPLAYED, UNSIGNED
from tests.serving.notebook.test_notebook_e2e import GIB, Notebooks, run_cell
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="acting as another uid needs root"),
]

STRANGER_UID = 60005
MIB = 1024 * 1024

STRANGER = r"""
import json, os, socket, sys, time
import zmq

# started as root (the interpreter's files need not be readable by the uid), then that uid
uid, host, ports, mode = int(sys.argv[1]), sys.argv[2], [int(p) for p in sys.argv[3].split(",")], sys.argv[4]
os.setgroups([]); os.setgid(uid); os.setuid(uid)
parent = os.getppid()
context = zmq.Context()

def dealer(url):
    sock = context.socket(zmq.DEALER)
    sock.linger = 60000
    sock.connect(url)
    return sock

def message(msg_type, signature, content=b"{}"):
    header = {"msg_id": os.urandom(8).hex(), "msg_type": msg_type, "session": "stranger", "version": "5.3"}
    return [b"<IDS|MSG>", signature, json.dumps(header).encode(), b"{}", b"{}", content]

def kernel_sockets():
    # the kernel's own sockets, as /proc/net/unix lists them to every uid: can this uid reach its shell (-1)?
    with open("/proc/net/unix") as table:
        names = {line.split()[-1] for line in table if "gpupool-kernel-" in line}
    shells = sorted(n for n in names if n.endswith("-1"))
    reached = []
    for name in shells:
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect("\0" + name[1:] if name.startswith("@") else name)
            reached.append(name)
        except OSError:
            pass
        finally:
            probe.close()
    return shells, reached

sockets = [dealer(f"tcp://{host}:{port}") for port in ports]
shells, reached = kernel_sockets()
print(json.dumps({"uid": os.getuid(), "kernel_sockets": shells, "reached": reached}), flush=True)
if mode == "burst":  # COUNT messages of SIZE bytes to each port, unsigned and forged in turn
    count, size = int(sys.argv[5]), int(sys.argv[6])
    content = b'{"code": "' + b"x" * size + b'"}'
    for n in range(count):
        signature = b"" if n % 2 else os.urandom(32).hex().encode()
        for sock in sockets:
            sock.send_multipart(message("execute_request", signature, content))
elif mode == "drip":  # until killed: every INTERVAL s, an unsigned request and a replayed IOPub message
    interval = float(sys.argv[5])
    iopub = context.socket(zmq.SUB)
    iopub.setsockopt(zmq.SUBSCRIBE, b"")
    iopub.connect(f"tcp://{host}:{sys.argv[6]}")
    kernel = [dealer("ipc://" + name) for name in reached]
    print(json.dumps({"subscribed": True}), flush=True)
    while not iopub.poll(1000):
        if os.getppid() != parent:  # ends with the test
            sys.exit(1)
    captured = iopub.recv_multipart()  # signed by the kernel: valid, but not the owner's request
    print(json.dumps({"captured": True}), flush=True)
    while os.getppid() == parent:  # ends with the test
        for sock in sockets + kernel:
            sock.send_multipart(message("kernel_info_request", b""))
            sock.send_multipart(captured[captured.index(b"<IDS|MSG>"):])
        time.sleep(interval)
for sock in sockets:
    sock.close()
context.term()  # returns once every message has gone out
print(json.dumps({"sent": True}), flush=True)
"""


class Stranger:
    """The child under another uid; ends with the test."""

    def __init__(self, info: Dict[str, Any], channels: List[str], *args: str) -> None:
        ports = ",".join(str(info[f"{channel}_port"]) for channel in channels)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", STRANGER, str(STRANGER_UID), str(info["ip"]), ports, *args],
            cwd="/",
            stdout=subprocess.PIPE,
        )

    def said(self, timeout: float = 60.0) -> Dict[str, Any]:
        """The next line the stranger printed (read a byte at a time: nothing read ahead)."""
        assert self.proc.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            assert self.ready(timeout), f"the stranger said nothing in {timeout:g} s"
            byte = os.read(self.proc.stdout.fileno(), 1)
            assert byte, f"the stranger ended (exit {self.proc.wait()})"
            line += byte
        return dict(json.loads(line))

    def ready(self, timeout: float) -> bool:
        assert self.proc.stdout is not None
        return bool(select.select([self.proc.stdout], [], [], timeout)[0])

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def strangers() -> Iterator[List[Stranger]]:
    started: List[Stranger] = []
    yield started
    for stranger in started:
        stranger.end()


def proxy_of(km: KernelManager) -> Any:
    return km.provisioner._proxy  # type: ignore[union-attr]


def dropped(km: KernelManager) -> int:
    return sum(proxy_of(km).dropped.values())


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_a_stranger_cannot_wake_a_parked_kernel(notebooks: Notebooks, strangers: List[Stranger]) -> None:
    notebooks.install("k", "--fraction", "0.25", "--idle-suspend", "1s")
    km, kc = notebooks.start("k")
    notebooks.on_gpu(kc, notebooks.lease_of(km), GIB)
    notebooks.wait_state(km, "suspended", timeout=15)
    count = 6
    stranger = Stranger(km.get_connection_info(), ["shell", "control", "stdin"], "burst", str(count), "100")
    strangers.append(stranger)
    assert stranger.said()["uid"] == STRANGER_UID
    assert stranger.said() == {"sent": True}
    # every message has reached the proxy's sockets: wait until it has dealt with them, or the break
    wait_until(
        lambda: notebooks.lease_of(km)["state"] != "suspended" or dropped(km) >= 3 * count,
        timeout=30,
        what="the proxy to drop the stranger's messages",
    )
    assert notebooks.lease_of(km)["state"] == "suspended", "a message without the key woke the kernel"
    assert dropped(km) == 3 * count and proxy_of(km).held_bytes == 0
    out, err, reply = run_cell(kc, "print('owner')", timeout=30)  # the owner's signed cell still wakes it
    assert reply["status"] == "ok" and out.strip() == "owner", err
    assert notebooks.lease_of(km)["state"] == "running"
    kc.stop_channels()


def test_a_stranger_cannot_keep_an_idle_kernel_on_the_gpu(notebooks: Notebooks, strangers: List[Stranger]) -> None:
    notebooks.install("k", "--fraction", "0.25", "--idle-suspend", "3s")
    km, kc = notebooks.start("k")
    notebooks.on_gpu(kc, notebooks.lease_of(km), GIB)
    info = km.get_connection_info()
    stranger = Stranger(info, ["shell", "control"], "drip", "0.5", str(info["iopub_port"]))
    strangers.append(stranger)
    seen = stranger.said()
    assert seen["kernel_sockets"], "another uid sees the kernel's sockets in /proc/net/unix"
    assert seen["reached"] == [], "but cannot connect to them"
    assert stranger.said() == {"subscribed": True}

    def captured() -> bool:  # the owner's cells until the stranger has a signed IOPub message
        run_cell(kc, "1")
        return stranger.ready(0.5)

    wait_until(captured, timeout=30, what="the stranger to capture a message the kernel signed")
    assert stranger.said() == {"captured": True}
    # a message on each channel every 0.5 s, unsigned or replayed: the 3 s idle limit parks it all the same
    notebooks.wait_state(km, "suspended", timeout=30)
    assert stranger.proc.poll() is None, "the stranger was sending all along"
    assert dropped(km) > 0 and set(proxy_of(km).dropped) == {UNSIGNED, REPLAYED}
    kc.stop_channels()


def test_a_stranger_cannot_grow_jupyter_while_a_resume_waits(notebooks: Notebooks, strangers: List[Stranger]) -> None:
    notebooks.install("a", "--fraction", "0.75", "--idle-suspend", "1s")
    notebooks.install("b", "--fraction", "0.75", "--idle-suspend", "1h")
    km_a, kc_a = notebooks.start("a")
    notebooks.on_gpu(kc_a, notebooks.lease_of(km_a), 10 * GIB)
    run_cell(kc_a, "x = sum(range(1000))")
    notebooks.wait_state(km_a, "suspended", timeout=15)
    km_b, kc_b = notebooks.start("b")  # takes the room: A's next cell waits for it
    notebooks.on_gpu(kc_b, notebooks.lease_of(km_b), 10 * GIB)
    msg_id = kc_a.execute("print(x + 1)")
    wait_until(lambda: proxy_of(km_a).gate.state == WAKING, timeout=20, what="A's resume to wait for room")
    before = rss_mib()
    count, size = 40, 20 * MIB
    stranger = Stranger(km_a.get_connection_info(), ["shell"], "burst", str(count), str(size))
    strangers.append(stranger)
    stranger.said()
    assert stranger.said(timeout=300) == {"sent": True}
    wait_until(
        lambda: dropped(km_a) >= count or proxy_of(km_a).held_bytes > count * size // 2,
        timeout=120,
        what="the proxy to read the stranger's messages",
    )
    grown = rss_mib() - before
    held = proxy_of(km_a).held_bytes
    assert 0 < held < MIB, f"the proxy holds {held} bytes for the parked kernel (the owner's request only)"
    assert dropped(km_a) == count
    # 800 MiB were sent; reading and dropping them one at a time leaves a few buffers at most
    assert grown < 300, f"the Jupyter process grew by {grown:.0f} MiB"
    assert notebooks.lease_of(km_a)["state"] == "suspended"
    kc_b.stop_channels()
    km_b.shutdown_kernel()  # room again: the owner's cell runs
    reply = kc_a.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:  # a late kernel_info_reply of wait_for_ready
        reply = kc_a.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "ok"
    assert notebooks.lease_of(km_a)["state"] == "running"
    kc_a.stop_channels()


@pytest.fixture
def notebooks(server_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Notebooks]:
    books = Notebooks(server_factory("--devices", "emulated:1x16GiB", "--ttl", "4"), tmp_path, monkeypatch)
    yield books
    books.shutdown_all()
