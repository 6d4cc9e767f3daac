"""Parse and format quantities: memory sizes and memory fractions."""

from __future__ import annotations

import re

from .errors import InvalidInput

_UNITS_MIB = {
    "": 1,  # a bare number is MiB, as in `gpupool run -m 8192`
    "mi": 1,
    "mib": 1,
    "m": 1,
    "mb": 1,
    "gi": 1024,
    "gib": 1024,
    "g": 1024,
    "gb": 1024,
    "ti": 1024 * 1024,
    "tib": 1024 * 1024,
}
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_memory_mib(text: str, what: str = "memory") -> int:
    """Parse '8192', '8Gi', '16GiB', '512MiB' into whole MiB (rounded up)."""
    match = _MEMORY_RE.match(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS_MIB:
        raise InvalidInput(
            f"{what} {text!r} is not a size: use MiB as a number (8192) or a unit such as 512MiB, 8Gi, 16GiB"
        )
    mib = float(match.group(1)) * _UNITS_MIB[unit]
    whole = int(mib) if mib == int(mib) else int(mib) + 1
    if whole <= 0:
        raise InvalidInput(f"{what} {text!r} must be greater than zero")
    return whole


def parse_fraction(text: str, what: str = "fraction") -> float:
    """Parse a memory fraction in (0, 1]; '50%' is accepted as 0.5."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise InvalidInput(f"{what} {text!r} is not a number: use a value in (0, 1], e.g. 0.5") from None
    if not 0 < value <= 1:
        raise InvalidInput(f"{what} {text!r} is outside (0, 1]: use e.g. 0.5 for half of each GPU's memory")
    return value


def format_mib(mib: int) -> str:
    """Human form: 16384 -> '16GiB', 1536 -> '1.5GiB', 900 -> '900MiB'."""
    if mib >= 1024:
        gib = mib / 1024
        return f"{gib:g}GiB" if gib == round(gib, 2) else f"{gib:.2f}GiB"
    return f"{mib}MiB"
