"""Relay a kernel's five ZeroMQ channels between the ports the frontend knows and the kernel's own.

One thread owns every socket. Shell, control and stdin are ROUTER (frontend side) to DEALER
(kernel side): the client's identity travels as the next frame, so replies and stdin's input
requests find their way back; the three DEALERs share one identity, since the kernel addresses
an input request to the identities of the shell request. IOPub is XPUB to XSUB (subscriptions
go through), heartbeats are ROUTER to DEALER. The gate sees every IOPub status and decides
whether a shell or control request goes on now or waits (while the lease is parked); waiting
requests keep their order. While the lease is parked the proxy answers heartbeats itself: a
parked kernel is alive, it is only not scheduled.
"""

from __future__ import annotations

import os
import queue
import threading
import uuid
from typing import TYPE_CHECKING

import zmq

from ..logs import get_logger
from . import wire

if TYPE_CHECKING:
    from typing import Any, Deque, Dict, List, Mapping, Optional, Protocol, Tuple

    class Gate(Protocol):
        def admit(self, channel: str, header: Optional[Dict[str, Any]]) -> bool: ...

        def on_status(self, state: str) -> None: ...

        def parked(self) -> bool: ...


log = get_logger(__name__)

GATED = ("shell", "control")
POLL_MS = 200


def _address(info: Mapping[str, Any], channel: str) -> str:
    transport, ip = info.get("transport", "tcp"), info["ip"]
    port = info[f"{channel}_port"]
    return f"{transport}://{ip}:{port}" if transport == "tcp" else f"{transport}://{ip}-{port}"


class KernelProxy(threading.Thread):
    """Binds the frontend's ports of `frontend`, connects to the kernel's ports of `backend`."""

    def __init__(self, frontend: Mapping[str, Any], backend: Mapping[str, Any], gate: Gate) -> None:
        super().__init__(name="gpupool-kernel-proxy", daemon=True)
        self.gate = gate
        self._context = zmq.Context()
        self._commands: queue.Queue[Tuple[str, List[bytes]]] = queue.Queue()
        self._wake_r, self._wake_w = os.pipe()
        self._held: Dict[str, Deque[List[bytes]]] = {}
        self._stopping = threading.Event()
        self.front: Dict[str, zmq.Socket[bytes]] = {}
        self.back: Dict[str, zmq.Socket[bytes]] = {}
        identity = f"gpupool-{uuid.uuid4().hex}".encode()
        kinds = {"shell": zmq.ROUTER, "control": zmq.ROUTER, "stdin": zmq.ROUTER, "hb": zmq.ROUTER, "iopub": zmq.XPUB}
        try:
            for channel, kind in kinds.items():
                front = self._context.socket(kind)
                front.linger = 0
                if kind == zmq.ROUTER:
                    front.router_handover = True  # a reconnecting client takes its identity back
                front.bind(_address(frontend, channel))
                self.front[channel] = front
                back = self._context.socket(zmq.XSUB if channel == "iopub" else zmq.DEALER)
                back.linger = 0
                if channel != "iopub":
                    back.setsockopt(zmq.IDENTITY, identity)
                back.connect(_address(backend, channel))
                self.back[channel] = back
        except zmq.ZMQError:
            self._close()
            raise
        from collections import deque

        self._held = {channel: deque() for channel in GATED}

    # Other threads: these only queue work for the proxy's thread.
    def publish(self, frames: List[bytes]) -> None:
        """Send a serialized message on IOPub (from any thread)."""
        self._command("publish", frames)

    def release(self) -> None:
        """Ask the gate again about the requests held (from any thread)."""
        self._command("release", [])

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._command("stop", [])
        if self.is_alive():
            self.join(timeout)
        else:
            self._close()

    def _command(self, what: str, frames: List[bytes]) -> None:
        self._commands.put((what, frames))
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # closed: the proxy has ended
            pass

    # The proxy's thread.
    def run(self) -> None:
        poller = zmq.Poller()
        for socket in (*self.front.values(), *self.back.values()):
            poller.register(socket, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while not self._stopping.is_set():
                for source, _ in poller.poll(POLL_MS):
                    if source == self._wake_r:
                        os.read(self._wake_r, 4096)
                        self._run_commands()
                    else:
                        self._relay(source)
        except Exception:  # the kernel's channels must not die silently
            log.exception("the kernel proxy failed")
        finally:
            self._close()

    def _run_commands(self) -> None:
        while True:
            try:
                what, frames = self._commands.get_nowait()
            except queue.Empty:
                return
            if what == "publish":
                self.front["iopub"].send_multipart(frames)
            elif what == "release":
                self._flush()
            elif what == "stop":
                self._stopping.set()

    def _relay(self, source: zmq.Socket[bytes]) -> None:
        frames = source.recv_multipart()
        for channel, front in self.front.items():
            if source is front:
                self._from_frontend(channel, frames)
                return
        for channel, back in self.back.items():
            if source is back:
                if channel == "iopub":
                    state = wire.execution_state(frames)
                    if state is not None:
                        self.gate.on_status(state)
                self.front[channel].send_multipart(frames)
                return

    def _from_frontend(self, channel: str, frames: List[bytes]) -> None:
        if channel == "hb" and self.gate.parked():
            self.front["hb"].send_multipart(frames)  # the echo the parked kernel would give
            return
        held = self._held.get(channel)
        if held is not None and (held or not self.gate.admit(channel, wire.header(frames))):
            held.append(frames)
            return
        self.back[channel].send_multipart(frames)

    def _flush(self) -> None:
        for channel, held in self._held.items():
            while held and self.gate.admit(channel, wire.header(held[0])):
                self.back[channel].send_multipart(held.popleft())

    def _close(self) -> None:
        for socket in (*self.front.values(), *self.back.values()):
            socket.close(linger=0)
        self._context.term()  # returns once the sockets are closed: the ports are free again
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.front, self.back = {}, {}
