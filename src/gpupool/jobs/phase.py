"""The one state model of jobs and replicas, whatever runs them (TorchX's AppState, trimmed).

Every executor reports its jobs and replicas in these phases, the local supervisor writes
them to state.json, and the CLI and `Executor.wait()` read `is_terminal`.
"""

from __future__ import annotations

import enum


class Phase(str, enum.Enum):
    """Where a job or one replica stands; the last four are terminal.

    A str: it compares equal to, prints and serializes as its name ("Running"), as stored.
    """

    PENDING = "Pending"  # accepted, not running yet (setup, image pull, scheduling)
    QUEUED = "Queued"  # waiting for its gang of GPUs to fit
    RUNNING = "Running"
    RESTARTING = "Restarting"  # backing off before replicas start again
    UNKNOWN = "Unknown"  # the executor cannot tell (a node lost contact)
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    STOPPED = "Stopped"  # a replica ended by the job (cancel, or the job ended without it)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def is_terminal(self) -> bool:
        """Whether the phase is final: nothing runs and nothing will."""
        return self in _TERMINAL

    @classmethod
    def parse(cls, text: str) -> Phase:
        """A phase from its stored name; an unknown name reads as UNKNOWN (a newer writer)."""
        try:
            return cls(text)
        except ValueError:
            return cls.UNKNOWN


_TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED, Phase.STOPPED})
