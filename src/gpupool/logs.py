"""Module loggers that import `logging` only when a record could be shown.

The workload side (`gpupool run`, `status`, `release`) starts before every job, and `logging`
costs more to import than the rest of a run's bookkeeping. Until something has imported
`logging`, nothing can have configured a handler or a level, so a DEBUG or INFO record would be
dropped anyway: `get_logger(__name__)` skips those without importing it, and hands WARNING and
above (and everything, once `logging` is loaded) to `logging.getLogger(name)`, as before.

`defer(setup)` lets the CLI postpone its `logging.basicConfig` to the first record that needs it.
`escaping_formatter()` is the formatter of every log gpupool writes: a record is one line, whatever
control or bidirectional characters a client put in the names it logs, and of bounded length
(`clip`), whatever their size. Stdlib only; every floor may import it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging as _logging_module
    from typing import Any, Callable, Optional

# logging's levels, for `isEnabledFor` without importing it.
DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
# What a continuation line of a record (its traceback) starts with, so no line of it reads as a record.
CONTINUATION = "  "
# A string argument of a record (a holder's label, a filter, a token name: client text) is cut to
# this many characters, and a record's message to MAX_LOG_MESSAGE_CHARS (an f-string, an object's
# str): a client's megabyte never becomes a megabyte line.
MAX_LOGGED_CHARS = 2048
MAX_LOG_MESSAGE_CHARS = 8192

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


def clip(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    """`text`, or its first `limit` characters and a marker that says how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[{len(text) - limit} more characters]"


class _Escapes(dict):  # type: ignore[type-arg]
    """str.translate's table: a character that is not printable (C0, DEL, C1, U+2028/2029, the
    bidirectional overrides and isolates such as U+202E, zero-width and other format characters,
    unassigned code points) as repr() writes it, a printable one as itself. Nothing is kept: the
    table stays empty however many characters clients send."""

    def __missing__(self, code: int) -> str:
        char = chr(code)
        return char if char.isprintable() else repr(char)[1:-1]


_ESCAPES = _Escapes()


def escape_controls(text: str) -> str:
    """`text` with every character that is not printable written as an escape, as repr() writes
    it: a newline in a holder's host or a lease label never starts a forged log line, no terminal
    escape sequence reaches the operator's terminal, and no U+202E reverses what a line says."""
    if text.isprintable():  # the common case, in C
        return text
    return text.translate(_ESCAPES)


def _clipped_args(args: Any) -> Any:
    """A record's arguments with each string cut by `clip` (the same object when none is long)."""
    if isinstance(args, tuple) and any(isinstance(a, str) and len(a) > MAX_LOGGED_CHARS for a in args):
        return tuple(clip(a) if isinstance(a, str) else a for a in args)
    if isinstance(args, dict) and any(isinstance(a, str) and len(a) > MAX_LOGGED_CHARS for a in args.values()):
        return {k: clip(a) if isinstance(a, str) else a for k, a in args.items()}
    return args


def escaping_formatter(fmt: str = LOG_FORMAT) -> _logging_module.Formatter:
    """A `logging.Formatter` of `fmt` whose every record is one line plus, for a traceback,
    continuation lines that start with CONTINUATION: control characters of the message (client
    text) are escaped, and those of an exception's message cannot start a line either."""
    import logging

    class EscapingFormatter(logging.Formatter):
        def formatMessage(self, record: logging.LogRecord) -> str:
            record.message = clip(record.message, MAX_LOG_MESSAGE_CHARS)
            return escape_controls(super().formatMessage(record))

        def format(self, record: logging.LogRecord) -> str:
            args = _clipped_args(record.args)
            if args is not record.args:  # a copy: other handlers see the record as it was made
                record = logging.makeLogRecord(dict(record.__dict__, args=args))
            head, sep, rest = super().format(record).partition("\n")  # the head has no newline left
            if not sep:
                return head
            return head + "".join(f"\n{CONTINUATION}{escape_controls(line)}" for line in rest.split("\n"))

    return EscapingFormatter(fmt)
