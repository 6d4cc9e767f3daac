"""One exception hierarchy, mapped once to CLI exit codes and HTTP statuses.

Every message names the bad value and the fix, because it is shown to the
user as is (CLI stderr, HTTP JSON error body).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..logs import clip

if TYPE_CHECKING:
    from typing import Any, Dict, Tuple, Type

# A value a message names is cut to this many characters (with a marker saying how many more): a
# message is one short line even when the value is a megabyte.
SHOWN_CHARS = 60


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`value` as a message names it: its repr, cut past `limit` characters of its text."""
    text = value if isinstance(value, str) else str(value)
    return repr(clip(text, limit)) if len(text) > limit else repr(value)


class GpupoolError(Exception):
    """Base of every error gpupool raises on purpose."""

    code = "error"  # stable machine-readable name, sent as error.code over HTTP
    http_status = 500
    exit_code = 1
    # What its exit code means, in every verb's --help (exit_codes_help); the first class of each
    # exit code in _CLASSES says it.
    meaning = "an error; the message says which"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> Dict[str, Any]:
        """The JSON error body: {"error": {"code": ..., "message": ...}}."""
        return {"error": {"code": self.code, "message": self.message}}


class InvalidInput(GpupoolError):
    """The user asked for something malformed (bad flag, bad field)."""

    code = "invalid_input"
    http_status = 400
    exit_code = 2
    meaning = "bad usage or input (a flag, a value, a file): the message names it"


class InvalidClaim(InvalidInput):
    """A claim that can never be valid (fraction out of range, -n 0 ...)."""

    code = "invalid_claim"
    http_status = 422


class Unsatisfiable(InvalidClaim):
    """A claim no device set of this pool could ever hold (more GPUs than exist)."""

    code = "unsatisfiable"
    http_status = 422


class TooLarge(InvalidInput):
    """A request body over the server's size limit."""

    code = "too_large"
    http_status = 413


# What a claim that found no room and may not wait is told; one that waits anyway drops it.
NO_ROOM_ADVICE = "wait for it with a wait time (e.g. --wait 600) or ask for less"


class Unavailable(GpupoolError):
    """The claim is valid but does not fit now (and the wait, if any, ran out)."""

    code = "unavailable"
    http_status = 409
    exit_code = 3
    meaning = "no room for the claim now, and its wait ran out"


class NotFound(GpupoolError):
    """No such lease, job or device."""

    code = "not_found"
    http_status = 404
    exit_code = 4
    meaning = "no such lease, claim, queue, job or token"


class Unauthorized(GpupoolError):
    """Missing or wrong bearer token."""

    code = "unauthorized"
    http_status = 401
    exit_code = 10
    meaning = "the pool refused the token: none or a wrong one (401), or not allowed to do this (403)"


class Forbidden(GpupoolError):
    """Authenticated, but not the lease's holder nor an admin."""

    code = "forbidden"
    http_status = 403
    exit_code = 10


class ClaimCancelled(GpupoolError):
    """A waiting claim was cancelled (`gpupool claim cancel`, by its holder or an admin) before it
    was granted: its command never started."""

    code = "claim_cancelled"
    http_status = 410
    exit_code = 11
    meaning = "the waiting claim was cancelled (`gpupool claim cancel`): its command did not start"


class TimeLimit(GpupoolError):
    """`gpupool run --time`'s limit passed while the command ran: its whole tree was ended, as a
    release ends it, and the history keeps the lease as ended by `timeout`."""

    code = "time_limit"
    http_status = 408
    exit_code = 12
    meaning = "the command ran past `gpupool run --time`: its whole tree was ended"


class StateLocked(GpupoolError):
    """Another server already owns this state directory."""

    code = "state_locked"
    http_status = 409
    exit_code = 2


class ServerUnreachable(GpupoolError):
    """No configured pool server answered."""

    code = "server_unreachable"
    http_status = 503
    exit_code = 5
    meaning = "no pool server answered"


class LeaseLost(GpupoolError):
    """The lease ended while its command still ran: released by its owner or an admin, its token
    revoked, or expired."""

    code = "lease_lost"
    http_status = 410
    exit_code = 6
    meaning = "the lease ended while its command ran (released, revoked, expired)"


class StateUnusable(GpupoolError):
    """The state dir's database cannot be used: damaged, not a database, read-only or full."""

    code = "state_unusable"
    http_status = 503
    exit_code = 7
    meaning = "the state dir's database is damaged, read-only or full"


class Preempted(GpupoolError):
    """The pool preempted the lease (its queue was borrowing) and `gpupool run` had no --requeue."""

    code = "preempted"
    http_status = 409
    exit_code = 8
    meaning = "the lease was preempted and the run had no --requeue"


class CheckpointFailed(GpupoolError):
    """The GPU state of a lease's processes could not be parked or brought back (suspend/resume);
    the message names the pid and the driver's error."""

    code = "checkpoint_failed"
    http_status = 500
    exit_code = 1


class NotAttested(GpupoolError):
    """The run could not prove its lease to the pool's node (the node refused, or stayed busy or
    down for the whole wait), so its command was not started: the node's watchdog would have
    counted its processes as unleased."""

    code = "not_attested"
    http_status = 503
    exit_code = 9
    meaning = "the node did not attest the run: its command did not start"


class NotCapped(GpupoolError):
    """The lease's limits could not be put in force where its command would run (in `mps`
    isolation: no MPS control daemon answered on the contract's pipe folder for the whole wait), so
    the command was not started: CUDA without a daemon runs with no memory or SM limit at all."""

    code = "not_capped"
    http_status = 503
    exit_code = 13
    meaning = "the lease's limits could not be put in force (no MPS daemon answered): its command did not start"


# General classes before their subclasses: the first class of an HTTP status is its reading.
_CLASSES: Tuple[Type[GpupoolError], ...] = (
    GpupoolError,
    InvalidInput,
    InvalidClaim,
    Unsatisfiable,
    TooLarge,
    Unavailable,
    NotFound,
    Unauthorized,
    Forbidden,
    StateLocked,
    ServerUnreachable,
    LeaseLost,
    ClaimCancelled,  # after LeaseLost: a bare 410 reads as a lost lease
    TimeLimit,
    StateUnusable,  # after ServerUnreachable: a bare 503 reads as an unreachable server
    Preempted,  # after Unavailable: a bare 409 reads as a full pool
    CheckpointFailed,  # after GpupoolError: a bare 500 reads as a server error
    NotAttested,  # after ServerUnreachable: a bare 503 reads as an unreachable server
    NotCapped,  # after ServerUnreachable: a bare 503 reads as an unreachable server
)
_BY_CODE: Dict[str, Type[GpupoolError]] = {cls.code: cls for cls in _CLASSES}
_BY_STATUS: Dict[int, Type[GpupoolError]] = {}
for _cls in _CLASSES:
    _BY_STATUS.setdefault(_cls.http_status, _cls)


def exit_codes_help() -> str:
    """The `exit codes:` paragraph of every verb's --help, one line per code, from the classes above."""
    meanings: Dict[int, str] = {0: "success"}
    for cls in _CLASSES:
        meanings.setdefault(cls.exit_code, cls.meaning)
    lines = [f"  {code:<3} {meanings[code]}" for code in sorted(meanings)]
    lines.append("  N   `gpupool run`, `kernel` and jobs: the command's own exit code (128+S: killed by signal S)")
    return "exit codes:\n" + "\n".join(lines) + "\n"


def error_for_status(status: int, message: str) -> GpupoolError:
    """The error an HTTP status means when the answer carries no error body of ours
    (a proxy's or the framework's): 409 is Unavailable, 422 InvalidClaim, unknown ones GpupoolError."""
    return _BY_STATUS.get(status, GpupoolError)(message)


def error_from_dict(body: Dict[str, Any], default_status: int = 500) -> GpupoolError:
    """Rebuild the exception a server sent as {"error": {"code", "message"}}."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return GpupoolError(f"server answered HTTP {default_status} with no error body")
    cls = _BY_CODE.get(str(err.get("code")), GpupoolError)
    return cls(str(err.get("message", "unknown error")))
