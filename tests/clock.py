"""FakeClock: a clock a test sets by hand, for Pool(clock=...) and anything else that takes one."""

from __future__ import annotations


class FakeClock:
    """Returns `now` when called; a test moves time by assigning or adding to `now`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
