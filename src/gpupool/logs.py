"""Module loggers that import `logging` only when a record could be shown.

The workload side (`gpupool run`, `status`, `release`) starts before every job, and `logging`
costs more to import than the rest of a run's bookkeeping. Until something has imported
`logging`, nothing can have configured a handler or a level, so a DEBUG or INFO record would be
dropped anyway: `get_logger(__name__)` skips those without importing it, and hands WARNING and
above (and everything, once `logging` is loaded) to `logging.getLogger(name)`, as before.

`defer(setup)` lets the CLI postpone its `logging.basicConfig` to the first record that needs it.
`escaping_formatter()` is the formatter of every log gpupool writes: a record is one line, whatever
control characters a client put in the names it logs. Stdlib only; every floor may import it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging as _logging_module
    from typing import Any, Callable, Dict, Optional

# logging's levels, for `isEnabledFor` without importing it.
DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
# What a continuation line of a record (its traceback) starts with, so no line of it reads as a record.
CONTINUATION = "  "

_pending: Optional[Callable[[], None]] = None


def defer(setup: Optional[Callable[[], None]]) -> None:
    """Run `setup` (the root logger's configuration) right before the first record is handed to
    `logging`; None drops a pending one."""
    global _pending
    _pending = setup


def _logger(name: str) -> _logging_module.Logger:
    """`logging.getLogger(name)`, importing `logging` and running the deferred setup on first need."""
    global _pending
    import logging

    setup, _pending = _pending, None
    if setup is not None:
        setup()
    return logging.getLogger(name)


class Logger:
    """The part of `logging.Logger` gpupool uses; the real logger is looked up per record, and
    records name the caller's line, not this proxy's."""

    __slots__ = ("name", "_real")

    def __init__(self, name: str) -> None:
        self.name = name
        self._real: Optional[_logging_module.Logger] = None

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        if "logging" in sys.modules:
            self._log(DEBUG, msg, args, kwargs)

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        if "logging" in sys.modules:
            self._log(INFO, msg, args, kwargs)

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(WARNING, msg, args, kwargs)

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(ERROR, msg, args, kwargs)

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        kwargs.setdefault("exc_info", True)
        self._log(ERROR, msg, args, kwargs)

    def isEnabledFor(self, level: int) -> bool:  # logging's name
        if level < WARNING and "logging" not in sys.modules:
            return False
        return self._logger().isEnabledFor(level)

    def _logger(self) -> _logging_module.Logger:
        if self._real is None:  # logging.getLogger gives one object per name for good
            self._real = _logger(self.name)
        return self._real

    def _log(self, level: int, msg: object, args: Any, kwargs: Any) -> None:
        # One frame for the public method, one for this one.
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 2
        self._logger().log(level, msg, *args, **kwargs)


def get_logger(name: str) -> Logger:
    """The logger of module `name` (use `get_logger(__name__)` at module level)."""
    return Logger(name)


_ESCAPES: Dict[int, str] = {}


def escape_controls(text: str) -> str:
    """`text` with its control characters (C0, DEL, C1, U+2028/2029) written as escapes, as repr()
    writes them: a newline in a holder's host or a lease label never starts a forged log line, and
    no terminal escape sequence reaches the operator's terminal."""
    if text.isprintable():  # the common case, in C
        return text
    if not _ESCAPES:
        for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029):
            _ESCAPES[code] = repr(chr(code))[1:-1]
    return text.translate(_ESCAPES)


def escaping_formatter(fmt: str = LOG_FORMAT) -> _logging_module.Formatter:
    """A `logging.Formatter` of `fmt` whose every record is one line plus, for a traceback,
    continuation lines that start with CONTINUATION: control characters of the message (client
    text) are escaped, and those of an exception's message cannot start a line either."""
    import logging

    class EscapingFormatter(logging.Formatter):
        def formatMessage(self, record: logging.LogRecord) -> str:
            return escape_controls(super().formatMessage(record))

        def format(self, record: logging.LogRecord) -> str:
            head, sep, rest = super().format(record).partition("\n")  # the head has no newline left
            if not sep:
                return head
            return head + "".join(f"\n{CONTINUATION}{escape_controls(line)}" for line in rest.split("\n"))

    return EscapingFormatter(fmt)
