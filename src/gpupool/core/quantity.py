"""Parse and format quantities: memory sizes and memory fractions.

One parser for every size gpupool reads (`gpupool run -m`, job specs, `gpupool.io/gpu-memory`,
filters, `--gpu-memory`, emulated devices), with Kubernetes' quantity semantics: `Ki Mi Gi Ti
Pi Ei` are binary, `k M G T P E` decimal, `e9` an exponent. Two things differ by where a size
is written, and only these: a bare number is MiB on the command line and in job specs (as
Bitfusion's `-m 8192`) but bytes in Kubernetes resources (as Kubernetes reads it). A size is
rounded down to whole MiB, so that a grant never exceeds what was written (`8G` = 8e9 bytes =
7629 MiB); under one MiB is refused. `m` (milli), `u` and `n` are refused for memory: in
Kubernetes `8000m` is 8 bytes, not 8000 MiB.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from .errors import InvalidInput, shown

if TYPE_CHECKING:
    from fractions import Fraction
    from typing import Optional, Union

MIB = 1024**2
BYTE = 1

_BINARY = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
# Spelled-out forms people write outside Kubernetes: `16GiB` is binary, `8GB` decimal (as SI).
_LONG = (
    {f"{k}B": v for k, v in _BINARY.items()} | {"kB": 10**3, "KB": 10**3} | {f"{k}B": v for k, v in _DECIMAL.items()}
)
# Fractions of a byte (their denominators): valid Kubernetes suffixes, never a memory size anyone means.
_SUB_BYTE = {"m": (10**3, "10^-3"), "u": (10**6, "10^-6"), "n": (10**9, "10^-9")}
# The most digits a number gpupool reads may have (a size, a device index), and the largest decimal
# exponent of a size: no memory or index anyone means comes near, Python refuses to read integers
# of over 4,300 digits (a ValueError, which became a 500), and 10**(10**9) would take the CPU.
MAX_NUMBER_DIGITS = 30
MAX_EXPONENT = 30
# sign, number (`8`, `8.5`, `.5`, `8.`), then a suffix or a decimal exponent.
_QUANTITY_RE = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|([A-Za-z]*))\s*$")


def parse_memory_mib(text: object, what: str = "memory", bare: int = MIB) -> int:
    """A memory size in whole MiB, rounded down; `bare` is what a number without a unit counts
    (MIB on the command line and in job specs, BYTE in Kubernetes resources)."""
    raw = str(text).strip()
    bare_name = "MiB" if bare == MIB else "bytes"
    fix = f"write e.g. 8Gi (8 GiB = 8192 MiB), 8G (8e9 bytes = 7629 MiB) or 8192Mi; a bare number is {bare_name}"
    # Before the regex and int(): a long text costs nothing to refuse, and is named cut short.
    if len(raw) > MAX_NUMBER_DIGITS + 8:  # the digits, a sign, a point, the longest unit or exponent
        raise InvalidInput(f"{what} {shown(raw)} is {len(raw)} characters long, too long for a size: {fix}")
    match = _QUANTITY_RE.match(raw)
    if not match:
        raise InvalidInput(f"{what} {text!r} is not a size: {fix}")
    number, exponent, suffix = _number(match.group(1)), match.group(2), match.group(3) or ""
    if exponent and abs(int(exponent[1:])) > MAX_EXPONENT:
        raise InvalidInput(f"{what} {shown(raw)}: the exponent is beyond e{MAX_EXPONENT}, no memory size; {fix}")
    if exponent:
        number = _exact(number) * _exact(10) ** int(exponent[1:])
        suffix = ""
    if suffix in _SUB_BYTE:
        denominator, power = _SUB_BYTE[suffix]
        raise InvalidInput(
            f"{what} {text!r}: {suffix!r} means {power} in Kubernetes, so {raw} is "
            f"{_bytes_text(_exact(number) / denominator)}, not a memory size; for MiB write {match.group(1)}Mi"
        )
    scale = _unit(suffix, bare)
    if scale is None:
        raise InvalidInput(f"{what} {text!r}: unit {suffix!r} is unknown or ambiguous; {fix}")
    size = number * scale
    if size <= 0:
        raise InvalidInput(f"{what} {text!r} must be greater than zero; {fix}")
    mib = int(size // MIB)
    if mib < 1:
        raise InvalidInput(f"{what} {text!r} is {_bytes_text(size)}, less than 1 MiB; {fix}")
    return mib


def _unit(suffix: str, bare: int) -> int | None:
    if suffix == "":
        return bare
    for table in (_BINARY, _DECIMAL, _LONG):
        if suffix in table:
            return table[suffix]
    # `16gib`, `16GIB`: any case of a spelled-out binary unit is unambiguous.
    for name, scale in _BINARY.items():
        if suffix.lower() == f"{name}b".lower():
            return scale
    return None  # `8g`, `8gb`, `8K`: ambiguous; the message shows both meanings


def _number(text: str) -> Union[int, Fraction]:
    """The number of a quantity, exactly: an int for whole numbers (the usual `16Gi`), else a
    Fraction (imported only then: `fractions` costs every `gpupool run` more than this parser)."""
    digits = text.lstrip("+-")
    if digits.isdecimal():
        return -int(digits) if text.startswith("-") else int(digits)
    return _exact(text)


def _exact(value: Union[int, str, Fraction]) -> Fraction:
    from fractions import Fraction

    return Fraction(value)


def _bytes_text(size: Union[int, Fraction]) -> str:
    return f"{float(size):g} bytes"


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


# Durations: 3s, 90m, 24h, 7d, 1w, or bare seconds (3600).
DURATION_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")


def duration_seconds(text: str) -> Optional[float]:
    """Seconds of a duration such as 3s, 90m, 24h, 7d, 1w or 3600 (bare seconds); None for another text."""
    match = _DURATION_RE.match(str(text).strip().lower())
    if match is None:
        return None
    seconds = float(match.group(1)) * DURATION_UNITS_S[match.group(2) or "s"]
    return seconds if math.isfinite(seconds) else None


def format_duration(seconds: float) -> str:
    """The shortest form `duration_seconds` reads back: 600 -> '10m', 5400 -> '90m', 3 -> '3s', 1.5 -> '1.5s'."""
    for unit, size in sorted(DURATION_UNITS_S.items(), key=lambda item: -item[1]):
        if seconds >= size and float(seconds) % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def parse_duration(text: str, what: str, low: float, high: float) -> float:
    """A duration in [low, high] seconds; InvalidInput naming `what`, the value and the forms."""
    seconds = duration_seconds(text)
    hint = "use e.g. 30s, 10m, 2h or 600 (seconds)"
    if seconds is None:
        raise InvalidInput(f"{what} {text!r} is not a duration: {hint}")
    if not low <= seconds <= high:
        raise InvalidInput(f"{what} {text!r} must be between {low:g} and {high:g} seconds: {hint}")
    return seconds


def format_mib(mib: int) -> str:
    """Human form: 16384 -> '16GiB', 1536 -> '1.5GiB', 900 -> '900MiB'."""
    if mib >= 1024:
        gib = mib / 1024
        return f"{gib:g}GiB" if gib == round(gib, 2) else f"{gib:.2f}GiB"
    return f"{mib}MiB"
