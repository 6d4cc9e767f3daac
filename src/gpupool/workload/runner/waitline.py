"""What `gpupool run --wait` shows while its claim waits: its place in the queue, why, and for how long.

On a terminal one line is redrawn in place (carriage return, erase to the end of the line) at
every poll, so the elapsed time moves; elsewhere (a pipe, a log file) a plain line is written only
when the place or the reason changes. The place comes from the pool's own order of waiting claims
(`PoolClient.waiting`, found by the claim's key), asked from a thread while the claim waits.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

from ...core.errors import GpupoolError

if TYPE_CHECKING:
    from typing import Callable, Optional, TextIO, Tuple

    from ...core.status import WaitingClaim
    from ..client.base import PoolClient

# How often a waiting run asks its place: the first time soon after it queued, then every POLL_S.
FIRST_POLL_S = 0.2
POLL_S = 1.0
CLEAR_TO_EOL = "\x1b[K"
DEFAULT_COLUMNS = 80


class WaitLine:
    """Shows the place of the claim with client key `key` in `client`'s queue on `stream` until `stop`."""

    def __init__(
        self,
        client: PoolClient,
        key: str,
        stream: TextIO,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.key = key
        self.stream = stream
        self.poll_s = poll_s
        self.clock = clock
        self.started = clock()
        self.terminal = _isatty(stream)
        self._shown: Optional[Tuple[int, bool, str]] = None  # (place, held, reason) last written
        self._drawn = False  # a redrawn line is on the terminal
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpupool-wait-line", daemon=True)

    @classmethod
    def starter(cls, stream: TextIO) -> Callable[[PoolClient, str], WaitLine]:
        """What `choose_and_claim(waiting_view=...)` calls when the claim queues."""

        def start(client: PoolClient, key: str) -> WaitLine:
            line = cls(client, key, stream)
            line._thread.start()
            return line

        return start

    def stop(self) -> None:
        """End the polls; on a terminal, erase the line so what follows starts on a clean one."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if self._drawn:
            self._write("\r" + CLEAR_TO_EOL)

    def _run(self) -> None:
        pause = FIRST_POLL_S
        while not self._stop.wait(pause):
            pause = self.poll_s
            try:
                mine = self.client.waiting(key=self.key)
            except GpupoolError:  # the server is away: the claim's own retries say so
                continue
            if mine and not self._stop.is_set():
                self.show(mine[0], self.clock() - self.started)

    def show(self, claim: WaitingClaim, elapsed_s: float) -> None:
        """Write the claim's place: redrawn on a terminal, a new line elsewhere when it changed."""
        place = "held" if claim.held else f"position {claim.position}"
        queue = f" of queue {claim.queue}" if claim.queue else ""
        text = f"gpupool: waiting {_elapsed(elapsed_s)}, {place}{queue} (claim {claim.ticket}): {claim.reason}"
        if self.terminal:
            # One line, cut to the terminal's width: a wrapped line could not be redrawn with \r.
            self._write("\r" + text[: _columns(self.stream) - 1] + CLEAR_TO_EOL)
            self._drawn = True
            return
        shown = (claim.position, claim.held, claim.reason)
        if shown != self._shown:
            self._shown = shown
            self._write(text + "\n")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the stream was closed: nobody reads the line
            pass


def _elapsed(seconds: float) -> str:
    seconds = int(max(seconds, 0.0))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _columns(stream: TextIO) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return DEFAULT_COLUMNS
    return max(columns, 20) if columns > 0 else DEFAULT_COLUMNS  # a new pty says 0 until it is sized
