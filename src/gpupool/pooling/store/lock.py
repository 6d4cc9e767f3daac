"""The server's exclusive lock on a state dir (fcntl), so two servers never share one.

Embedded clients do not take this lock: they share the database with the
server and coordinate through SQLite transactions.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import StateLocked
from ...logs import get_logger
from .private import STATE_FILE_MODE, make_private

if TYPE_CHECKING:
    from typing import Optional, Union

log = get_logger(__name__)

LOCK_NAME = "server.lock"


class StateLock:
    """An exclusive, non-blocking flock on `<state_dir>/server.lock`; released on close or death."""

    def __init__(self, state_dir: Union[str, Path], refused: str = "") -> None:
        """`refused`: what a StateLocked says after naming the server (default: a second server's advice)."""
        self.path = Path(state_dir) / LOCK_NAME
        self._fd: Optional[int] = None
        self._refused = refused

    def acquire(self) -> StateLock:
        make_private(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, STATE_FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = _read(fd)
            os.close(fd)
            if self._refused:
                raise StateLocked(
                    f"a gpupool server (pid {owner or '?'}) serves state dir {self.path.parent}: {self._refused}"
                ) from None
            raise StateLocked(
                f"another gpupool server (pid {owner or '?'}) already serves state dir {self.path.parent}: "
                "stop it, or give this one its own --state"
            ) from None
        # The pid is informative only; the kernel drops the flock when the process dies (kill -9 too).
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        log.debug("locked %s", self.path)
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> StateLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return os.read(fd, 32).decode(errors="replace").strip()
    except OSError:
        return ""
