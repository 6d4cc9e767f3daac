"""Claim filters: `device.name=GLOB`, `device.uuid=ID`, `device.memory>=MiB`, `server.addr=HOST`.

Device keys are checked by placement; `server.*` keys choose among pool
servers on the client side and admit every device.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import InvalidClaim
from .quantity import parse_memory_mib

if TYPE_CHECKING:  # pragma: no cover
    from typing import Protocol

    class Device(Protocol):
        """What a filter reads of a core.model.Device (which imports this module: no import back)."""

        @property
        def name(self) -> str: ...
        @property
        def uuid(self) -> str: ...
        @property
        def index(self) -> int: ...
        @property
        def memory_mib(self) -> int: ...


KEYS = ("device.name", "device.uuid", "device.index", "device.memory", "server.addr")
_NUMERIC_KEYS = ("device.index", "device.memory")
# Compiled on first use (re caches it): most runs name no filter.
_FILTER_PATTERN = r"^\s*([a-zA-Z_.]+)\s*(>=|<=|=)\s*(.+?)\s*$"


@dataclass(frozen=True)
class Filter:
    """One `key op value` condition; op is '=', '>=' or '<='."""

    key: str
    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Filter:
        """Parse 'device.memory>=16GiB' and friends; unknown keys are rejected."""
        match = re.match(_FILTER_PATTERN, text)
        if not match:
            raise InvalidClaim(f"filter {text!r} is not KEY=VALUE: use e.g. device.name=*A100* or device.memory>=16384")
        key, op, value = match.group(1).lower(), match.group(2), match.group(3)
        if key not in KEYS:
            raise InvalidClaim(f"filter key {key!r} is unknown: use one of {', '.join(KEYS)}")
        if op != "=" and key not in _NUMERIC_KEYS:
            raise InvalidClaim(f"filter {text!r}: {key} only supports '=' (globs allowed), not {op!r}")
        if key == "device.memory":
            value = str(parse_memory_mib(value, what=f"filter {text!r} memory"))
        elif key == "device.index" and not value.isdigit():
            raise InvalidClaim(f"filter {text!r}: device.index needs a whole number, e.g. device.index=0")
        return cls(key, op, value)

    def to_text(self) -> str:
        return f"{self.key}{self.op}{self.value}"

    @property
    def is_server_filter(self) -> bool:
        return self.key.startswith("server.")

    def matches(self, device: Device) -> bool:
        """Whether `device` passes; server filters admit every device."""
        if self.is_server_filter:
            return True
        if self.key == "device.name":
            return fnmatch.fnmatchcase(device.name.lower(), self.value.lower())
        if self.key == "device.uuid":
            return fnmatch.fnmatchcase(device.uuid, self.value)
        actual = device.memory_mib if self.key == "device.memory" else device.index
        return _compare(actual, self.op, int(self.value))

    def matches_server(self, addr: str) -> bool:
        """Whether a pool server at `addr` passes; device filters admit every server."""
        if not self.is_server_filter:
            return True
        return fnmatch.fnmatchcase(addr.lower(), self.value.lower()) or self.value.lower() in addr.lower()


def _compare(actual: int, op: str, wanted: int) -> bool:
    if op == ">=":
        return actual >= wanted
    if op == "<=":
        return actual <= wanted
    return actual == wanted
