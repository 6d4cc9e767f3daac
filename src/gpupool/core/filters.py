"""Claim filters: `device.name=GLOB`, `device.uuid=ID`, `device.memory>=MiB`, `server.addr=HOST`.

Device keys are checked by placement; `server.*` keys choose among pool
servers on the client side and admit every device.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import InvalidClaim, InvalidInput, shown
from .quantity import MAX_NUMBER_DIGITS, parse_memory_mib

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
# The longest filter text: a glob or a size is tens of characters. Checked before any regex reads it.
MAX_FILTER_CHARS = 256
# Compiled on first use (re caches it): most runs name no filter. Matched on the stripped text, so no
# part of it looks for trailing spaces (a lazy value before `\s*$` took seconds on 10,000 of them).
_FILTER_PATTERN = r"([a-zA-Z_.]+)\s*(>=|<=|=)\s*(.+)"
_INDEX_PATTERN = r"[0-9]+"  # ASCII digits: str.isdigit() takes '²', which int() refuses


@dataclass(frozen=True)
class Filter:
    """One `key op value` condition; op is '=', '>=' or '<='."""

    key: str
    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Filter:
        """Parse 'device.memory>=16GiB' and friends; unknown keys are rejected. Every message names
        the filter cut short (`shown`): a filter may be a client's megabyte."""
        named = f"filter {shown(text)}"
        if len(text) > MAX_FILTER_CHARS:
            raise InvalidInput(
                f"{named} is {len(text)} characters long, over the {MAX_FILTER_CHARS} allowed: "
                "use e.g. device.name=*A100* or device.memory>=16384"
            )
        match = re.fullmatch(_FILTER_PATTERN, text.strip())
        if not match:
            raise InvalidClaim(f"{named} is not KEY=VALUE: use e.g. device.name=*A100* or device.memory>=16384")
        key, op, value = match.group(1).lower(), match.group(2), match.group(3)
        if key not in KEYS:
            raise InvalidClaim(f"filter key {shown(key)} is unknown: use one of {', '.join(KEYS)}")
        if op != "=" and key not in _NUMERIC_KEYS:
            raise InvalidClaim(f"{named}: {key} only supports '=' (globs allowed), not {op!r}")
        if key == "device.memory":
            value = str(parse_memory_mib(value, what=f"filter {key}{op}"))
        elif key == "device.index":
            if not re.fullmatch(_INDEX_PATTERN, value):
                raise InvalidClaim(f"{named}: device.index needs a whole number, e.g. device.index=0")
            if len(value) > MAX_NUMBER_DIGITS:
                raise InvalidInput(
                    f"{named}: the index has {len(value)} digits, over the {MAX_NUMBER_DIGITS} allowed: "
                    "give a GPU's index as `gpupool status` shows it, e.g. device.index=0"
                )
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
