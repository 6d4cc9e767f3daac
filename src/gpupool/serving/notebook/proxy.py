"""Relay a kernel's five ZeroMQ channels between the ports the frontend knows and the kernel's own.

One thread owns every socket. Shell, control and stdin are ROUTER (frontend side) to DEALER
(kernel side): the client's identity travels as the next frame, so replies and stdin's input
requests find their way back; the three DEALERs share one identity, since the kernel addresses
an input request to the identities of the shell request. IOPub is XPUB to XSUB (subscriptions
go through), heartbeats are ROUTER to DEALER. The gate sees every IOPub status and decides
whether a shell or control request goes on now or waits (while the lease is parked); waiting
requests keep their order. While the lease is parked the proxy answers heartbeats itself: a
parked kernel is alive, it is only not scheduled.

The frontend's ports are loopback TCP, which any local user can reach, so the proxy checks what
the kernel would check before acting on it: a shell, control or stdin message counts as activity,
is held or goes on only when signed with the kernel's key (the frontend's connection file, 0600),
and not one of the kernel's own (its IOPub is readable by all: a captured status message replayed
would be signed). Others are dropped and counted, and what is held for a parked kernel is bounded.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from collections import Counter, deque
from typing import TYPE_CHECKING

import zmq

from ...logs import get_logger
from . import wire

if TYPE_CHECKING:
    from typing import Any, Deque, Dict, List, Mapping, Optional, Protocol, Tuple

    class Gate(Protocol):
        def admit(self, channel: str, header: Optional[Dict[str, Any]]) -> bool: ...

        def on_status(self, state: str) -> None: ...

        def parked(self) -> bool: ...


log = get_logger(__name__)

GATED = ("shell", "control")
SIGNED = ("shell", "control", "stdin")  # the channels the kernel checks signatures on
POLL_MS = 200
# Held for a parked kernel at most, all channels together; past either, a message is dropped.
HELD_MAX_MESSAGES = 1000
HELD_MAX_BYTES = 64 * 1024 * 1024
# A heartbeat is a few bytes and IOPub's inbound frames are subscriptions (Jupyter's: b"\x01"):
# ZeroMQ disconnects a peer sending a bigger frame there before reading it.
SMALL_FRAME_MAX = 1024
KERNEL_SESSIONS_MAX = 16
DROP_LOG_EVERY_S = 10.0
# Why a message from the frontend's side was dropped (the keys of `KernelProxy.dropped`).
UNSIGNED, REPLAYED, OVER_LIMIT = "unsigned", "replayed", "over the limit"
WHY = {
    UNSIGNED: "without the kernel's signature (a local process without its key)",
    REPLAYED: "signed by the kernel itself (replayed from its output)",
    OVER_LIMIT: f"past what a parked kernel's requests may hold ({HELD_MAX_MESSAGES} messages, "
    f"{HELD_MAX_BYTES // (1024 * 1024)} MiB)",
}


def _address(info: Mapping[str, Any], channel: str) -> str:
    transport, ip = info.get("transport", "tcp"), info["ip"]
    port = info[f"{channel}_port"]
    return f"{transport}://{ip}:{port}" if transport == "tcp" else f"{transport}://{ip}-{port}"


class KernelProxy(threading.Thread):
    """Binds the frontend's ports of `frontend`, connects to the kernel's ports of `backend`."""

    def __init__(self, frontend: Mapping[str, Any], backend: Mapping[str, Any], gate: Gate) -> None:
        super().__init__(name="gpupool-kernel-proxy", daemon=True)
        self.gate = gate
        self.signer = wire.Signer(frontend.get("key", b""), str(frontend.get("signature_scheme", "hmac-sha256")))
        self.dropped: Counter[str] = Counter()  # by reason, for the log and tests
        self.held_bytes = 0
        self._held_count = 0
        self._unlogged: Counter[Tuple[str, str]] = Counter()
        self._logged_at = float("-inf")
        self._senders: Deque[str] = deque(maxlen=KERNEL_SESSIONS_MAX)  # sessions the kernel's side signs with
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
                if channel in ("hb", "iopub"):
                    front.setsockopt(zmq.MAXMSGSIZE, SMALL_FRAME_MAX)
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
        self._held = {channel: deque() for channel in GATED}
        if not self.signer.key:
            log.warning("the kernel's connection file has no key: any local user can send it messages")

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
                self._log_drops()
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
                self._note_sender(frames, trusted=True)
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
                if channel != "hb":
                    self._note_sender(frames)
                if channel == "iopub":
                    state = wire.execution_state(frames)
                    if state is not None and self.signer.valid(frames):
                        self.gate.on_status(state)
                self.front[channel].send_multipart(frames)
                return

    def _from_frontend(self, channel: str, frames: List[bytes]) -> None:
        if channel == "hb":
            if self.gate.parked():
                self.front["hb"].send_multipart(frames)  # the echo the parked kernel would give
            else:
                try:  # never wait on a kernel stopped by a suspension the gate has not seen yet
                    self.back["hb"].send_multipart(frames, zmq.NOBLOCK)
                except zmq.Again:
                    pass  # a lost heartbeat, as from a stopped kernel
            return
        if channel in SIGNED:
            why = self._refusal(frames)
            if why:
                self._drop(channel, why)
                return
        held = self._held.get(channel)
        if held is not None and (held or not self.gate.admit(channel, wire.header(frames))):
            self._hold(channel, held, frames)
            return
        self.back[channel].send_multipart(frames)

    def _refusal(self, frames: List[bytes]) -> str:
        """Why a message from the frontend's side must not reach the gate or the kernel ('' if none)."""
        if not self.signer.valid(frames):
            return UNSIGNED
        if self.signer.key and wire.session(frames) in self._senders:
            return REPLAYED
        return ""

    def _note_sender(self, frames: List[bytes], trusted: bool = False) -> None:
        """Remember the session a kernel-side message is signed in: the frontend's never is."""
        session = wire.session(frames)
        if session and session not in self._senders and (trusted or self.signer.valid(frames)):
            self._senders.append(session)

    def _hold(self, channel: str, held: Deque[List[bytes]], frames: List[bytes]) -> None:
        size = sum(len(frame) for frame in frames)
        if self._held_count >= HELD_MAX_MESSAGES or self.held_bytes + size > HELD_MAX_BYTES:
            self._drop(channel, OVER_LIMIT)
            return
        held.append(frames)
        self._held_count += 1
        self.held_bytes += size

    def _drop(self, channel: str, why: str) -> None:
        self.dropped[why] += 1
        self._unlogged[(channel, why)] += 1
        self._log_drops()

    def _log_drops(self) -> None:
        """One line at most every DROP_LOG_EVERY_S, with the counts since the last (no message content)."""
        if not self._unlogged or time.monotonic() - self._logged_at < DROP_LOG_EVERY_S:
            return
        self._logged_at = time.monotonic()
        counts = "; ".join(f"{n} on {channel} {WHY[why]}" for (channel, why), n in sorted(self._unlogged.items()))
        self._unlogged.clear()
        log.warning("kernel proxy dropped messages: %s", counts)

    def _flush(self) -> None:
        for channel, held in self._held.items():
            while held and self.gate.admit(channel, wire.header(held[0])):
                frames = held.popleft()
                self._held_count -= 1
                self.held_bytes -= sum(len(frame) for frame in frames)
                self.back[channel].send_multipart(frames)

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
