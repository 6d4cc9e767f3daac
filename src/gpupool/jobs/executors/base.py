"""The one small interface every executor implements (TorchX's Scheduler, trimmed).

`dryrun(spec)` builds exactly what would be submitted and `str()` of it is
what `--dry-run` prints; `schedule(info)` submits that very object, so a dry
run never differs from the real thing.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

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
    name: str
    status: str
    exit_code: Optional[int] = None
    restarts: int = 0
    devices: str = ""


@dataclass(frozen=True)
class JobDescription:
    """A job as `gpupool jobs` shows it, whatever ran it."""

    name: str
    target: str
    status: str
    message: str = ""
    restarts: int = 0
    lease_id: str = ""
    submitted_at: Optional[float] = None
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    replicas: List[ReplicaDescription] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.status in ("Succeeded", "Failed", "Cancelled")

    def to_dict(self) -> Dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


class Executor(abc.ABC):
    """Runs job specs somewhere: local processes, a Kubernetes cluster ..."""

    target: str = ""

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
