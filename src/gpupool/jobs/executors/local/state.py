"""Job state on disk, so `gpupool jobs/logs/cancel` work from any shell.

Layout under the pool state dir::

    jobs/<name>/spec.json        the validated spec
    jobs/<name>/state.json       JobState, rewritten atomically by the supervisor
    jobs/<name>/cancel           marker: cancel was asked (the supervisor polls it)
    jobs/<name>/logs/<replica>.log, logs/supervisor.log

The supervisor is the only writer of state.json while it lives; `cancel`
writes it only after the supervisor is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from ....core.errors import InvalidInput, NotFound
from ....pooling.store.private import private_folder
from ....workload.client.embedded import default_state_dir
from ...phase import Phase


@dataclass
class ReplicaState:
    """One replica's last known process and outcome."""

    role: str
    index: int
    status: str = Phase.PENDING.value  # a Phase's value: Pending | Running | Succeeded | Failed | Stopped
    pid: int = 0
    exit_code: Optional[int] = None
    restarts: int = 0
    devices: str = ""  # CUDA_VISIBLE_DEVICES it got


@dataclass
class JobState:
    """Everything `gpupool jobs` shows and `cancel` needs."""

    name: str
    status: str = Phase.PENDING.value
    message: str = ""
    target: str = "local"
    submitted_at: float = field(default_factory=time.time)
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    supervisor_pid: int = 0
    lease_id: str = ""
    servers: List[str] = field(default_factory=list)  # pool servers; empty: the embedded pool
    ttl_s: float = 30.0  # lease TTL: how long GPUs stay held after the supervisor dies
    workdir: str = ""  # replicas' working directory (where submit ran, plus spec workingDir)
    restarts: int = 0
    preemptions: int = 0  # times the pool preempted the job's lease and it queued again
    ports: List[int] = field(default_factory=list)
    replicas: Dict[str, ReplicaState] = field(default_factory=dict)

    @property
    def phase(self) -> Phase:
        return Phase.parse(self.status)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> JobState:
        data = dict(data)
        reps = {k: ReplicaState(**v) for k, v in (data.pop("replicas", None) or {}).items()}
        known = set(cls.__dataclass_fields__)
        return cls(replicas=reps, **{k: v for k, v in data.items() if k in known})


class JobStore:
    """The job directories under one state dir."""

    def __init__(self, state_dir: Optional[Path] = None) -> None:
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.root = self.state_dir / "jobs"

    def job_dir(self, name: str) -> Path:
        return self.root / name

    def log_path(self, name: str, replica: str) -> Path:
        return self.job_dir(name) / "logs" / f"{replica}.log"

    def exists(self, name: str) -> bool:
        return (self.job_dir(name) / "state.json").exists()

    def create(self, name: str, spec: Dict[str, Any], state: JobState) -> Path:
        """A fresh job dir; a finished job of the same name is replaced, a live one refused."""
        path = self.job_dir(name)
        if self.exists(name):
            old = self.load(name)
            if not old.phase.is_terminal:
                raise InvalidInput(
                    f"job {name!r} is {old.status}: cancel it (gpupool cancel {name}) or change 'name' in the spec"
                )
            shutil.rmtree(path)
        private_folder(self.root)  # specs with their env, logs: the owner's only (store.private)
        (path / "logs").mkdir(parents=True, exist_ok=True)
        _write_json(path / "spec.json", spec)
        self.save(state)
        return path

    def save(self, state: JobState) -> None:
        _write_json(self.job_dir(state.name) / "state.json", state.to_dict())

    def load(self, name: str) -> JobState:
        path = self.job_dir(name) / "state.json"
        try:
            return JobState.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            known = ", ".join(self.names()) or "none"
            raise NotFound(f"no job named {name!r} (known jobs: {known}); see `gpupool jobs`") from None
        except ValueError:
            # Writes are atomic, so this is a hand-edited or foreign file.
            raise InvalidInput(f"{path} is not valid JSON: remove the job dir or fix the file") from None

    def load_spec(self, name: str) -> Dict[str, Any]:
        spec: Dict[str, Any] = json.loads((self.job_dir(name) / "spec.json").read_text())
        return spec

    def names(self) -> List[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "state.json").exists())

    def all(self) -> List[JobState]:
        out = []
        for name in self.names():
            try:
                out.append(self.load(name))
            except (NotFound, InvalidInput):
                continue  # removed or torn between listing and reading
        return sorted(out, key=lambda s: s.submitted_at)

    def request_cancel(self, name: str) -> None:
        (self.job_dir(name) / "cancel").touch()

    def cancel_requested(self, name: str) -> bool:
        return (self.job_dir(name) / "cancel").exists()


def _write_json(path: Path, data: Any) -> None:
    """Write atomically: readers in other shells never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)
