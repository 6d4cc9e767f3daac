"""The one small interface every executor implements (TorchX's Scheduler, trimmed).

`dryrun(spec)` builds exactly what would be submitted and `str()` of it is
what `--dry-run` prints; `schedule(info)` submits that very object, so a dry
run never differs from the real thing. `wait(name)` polls `describe(name)` until the
job's phase is terminal, the same for every executor.
"""

from __future__ import annotations

import abc
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, Iterator, List, Optional

from ...core.errors import NotFound, Unavailable
from ..phase import Phase
from ..spec import JobSpec


@dataclass(frozen=True)
class DryRunInfo:
    """What an executor would submit: `request` for `schedule`, `text` for humans."""

    target: str
    spec: JobSpec
    request: Any
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class ReplicaDescription:
    """One replica (a process, or a pod) as `gpupool jobs NAME` shows it."""

    name: str
    status: Phase
    exit_code: Optional[int] = None
    restarts: int = 0
    devices: str = ""


@dataclass(frozen=True)
class JobDescription:
    """A job as `gpupool jobs` shows it, whatever ran it."""

    name: str
    target: str
    status: Phase
    message: str = ""
    restarts: int = 0
    lease_id: str = ""
    submitted_at: Optional[float] = None
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    replicas: List[ReplicaDescription] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.status.is_terminal

    def to_dict(self) -> Dict[str, Any]:
        """The `gpupool jobs --json` shape: phases as their names."""
        out = asdict(self)
        out["status"] = self.status.value
        for rep, data in zip(self.replicas, out["replicas"]):
            data["status"] = rep.status.value
        return out


class Executor(abc.ABC):
    """Runs job specs somewhere: local processes, a Kubernetes cluster ..."""

    target: str = ""
    poll_s: float = 2.0  # how often wait() asks describe()

    @abc.abstractmethod
    def dryrun(self, spec: JobSpec) -> DryRunInfo:
        """Everything that would be submitted for `spec`, validated, nothing started."""

    @abc.abstractmethod
    def schedule(self, info: DryRunInfo) -> str:
        """Submit what `dryrun` built; returns the job name."""

    @abc.abstractmethod
    def describe(self, name: str) -> JobDescription:
        """The job's state; raises NotFound for an unknown name."""

    @abc.abstractmethod
    def list(self) -> List[JobDescription]:
        """Every job this executor knows of, oldest first."""

    @abc.abstractmethod
    def log_lines(self, name: str, replica: Optional[str] = None, follow: bool = False) -> Iterator[str]:
        """Log lines of one replica, or of all (each prefixed "[replica] "); `follow` waits for
        more until the job ends."""

    @abc.abstractmethod
    def cancel(self, name: str) -> str:
        """Stop the job and free its GPUs; returns a one-line outcome for the user."""

    def wait(self, name: str, timeout_s: Optional[float] = None) -> JobDescription:
        """Block until the job's phase is terminal; its last description.

        Raises:
            Unavailable: `timeout_s` passed first.
        """
        end = None if timeout_s is None else time.monotonic() + timeout_s
        found: Optional[JobDescription] = None
        while True:
            try:
                found = self.describe(name)
            except NotFound:
                if found is None:
                    raise
                # It was there and is gone: deleted (cancelled) from elsewhere.
                return replace(found, status=Phase.CANCELLED, message="deleted")
            if found.terminal:
                return found
            if end is not None and time.monotonic() >= end:
                raise Unavailable(
                    f"job {name!r} is still {found.status.value} after {timeout_s:g} s; "
                    f"wait longer, or cancel it with gpupool cancel {name}"
                )
            time.sleep(self.poll_s if end is None else max(0.0, min(self.poll_s, end - time.monotonic())))
