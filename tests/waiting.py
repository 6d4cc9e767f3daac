"""Waiting for a condition with a deadline, never for a duration: one helper for every test.

A test that sleeps and then asserts is slow where the machine is fast and
flaky where it is loaded (two cores shared by a CI run); polling a predicate
until a deadline is neither.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, what: str = "", *, interval: float = 0.05) -> T:
    """Poll `predicate` until it returns something true, and return that; fail at the deadline.

    The predicate runs once more at the deadline, so a slow poll never fails a
    condition that holds; the failure names `what` and the last value seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what or predicate!r}: last value {value!r}"
            )
        time.sleep(interval)
