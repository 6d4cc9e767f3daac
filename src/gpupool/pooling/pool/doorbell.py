"""Doorbells: a committed write in one process wakes the watches of another on an embedded pool.

An embedded pool's state dir is written by every `gpupool run` and CLI verb on it, each with a
pool of its own, so a write's LeaseBoard bump (pool/notify.py) reaches only its own process. A
watch hangs a doorbell: a Unix datagram socket named after its lease in the state dir's `watch/`
folder (0700: the state dir is its owner's alone, as pool.db is). A committed write that changed
a lease rings every doorbell of that lease: one byte that says only "read the lease again". A
watch drains its doorbell before each read, so a ring during the read wakes the wait after it.
The periodic re-read stays the fallback: for a path too long for AF_UNIX, a full socket buffer,
a writer of an older release.
"""

from __future__ import annotations

import itertools
import os
import select
import socket
from pathlib import Path
from typing import Iterable, Optional

FOLDER = "watch"
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes, one of them the terminating NUL
_numbers = itertools.count()


class Doorbell:
    """One watch's socket; `close` takes it down (its file too)."""

    def __init__(self, sock: socket.socket, path: str) -> None:
        self.sock, self.path = sock, path

    def drain(self) -> None:
        """Forget the rings so far (called before each read of the lease)."""
        try:
            while True:
                self.sock.recv(64)
        except OSError:  # BlockingIOError: nothing left
            return

    def wait(self, timeout_s: float) -> bool:
        """Until a ring or `timeout_s`; True when rung."""
        ready, _, _ = select.select([self.sock], [], [], timeout_s)
        return bool(ready)

    def poke(self) -> None:
        """Ring it from this process (its pool closes: the watch must look up)."""
        try:
            self.sock.sendto(b"!", self.path)
        except OSError:  # closed meanwhile, or rung already
            pass

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def hang(state_dir: Path, lease_id: str) -> Optional[Doorbell]:
    """A doorbell for a watch of `lease_id`, or None where none can be hung (the watch re-reads)."""
    folder = state_dir / FOLDER
    path = str(folder / f"{lease_id}.{os.getpid()}.{next(_numbers)}")
    if len(os.fsencode(path)) > _SUN_PATH_MAX:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        try:
            os.unlink(path)  # left by a process killed with this pid and number
        except FileNotFoundError:
            pass
        sock.bind(path)
        sock.setblocking(False)
    except OSError:
        sock.close()
        return None
    return Doorbell(sock, path)


def ring(state_dir: Path, lease_ids: Iterable[str]) -> None:
    """Ring every doorbell of these leases; a doorbell nobody answers (its process was killed) goes."""
    folder = state_dir / FOLDER
    wanted = set(lease_ids)
    try:
        names = [n for n in os.listdir(folder) if n.split(".", 1)[0] in wanted]
    except OSError:  # no watch has hung one yet
        return
    if not names:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.setblocking(False)
        for name in names:
            path = str(folder / name)
            try:
                sock.sendto(b"!", path)
            except ConnectionRefusedError:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            except OSError:  # a full buffer: it has rings to read already
                pass
