"""The jobs of a state dir as the web dashboard shows them: phase, replicas, the tail of each log.

The dashboard (server floor) cannot import the jobs floor; `gpupool server`
hands it `reader(state_dir)`, which reads the same files `gpupool jobs` and
`gpupool logs` read (state.JobStore), at each refresh.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, List, Tuple, Union

from ....serving.server.dashboard.view import JobRow, ReplicaRow
from .state import JobState, JobStore

TAIL_LINES = 5
TAIL_BYTES = 4096  # a log's last lines are in its last few KiB; never read a whole log per refresh
MAX_JOBS = 50  # the newest; older ones stay in `gpupool jobs`


def log_tail(path: Path, lines: int = TAIL_LINES) -> Tuple[str, ...]:
    """The last `lines` lines of a log file ('' when it does not exist yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
    except OSError:
        return ()
    text = data.decode("utf-8", "replace").splitlines()
    if size > TAIL_BYTES and text:
        text = text[1:]  # the first line read is probably cut
    return tuple(text[-lines:])


def job_rows(store: JobStore, limit: int = MAX_JOBS) -> List[JobRow]:
    """The newest `limit` jobs of `store`, replicas in role order."""
    jobs: List[JobState] = store.all()[-limit:]
    return [
        JobRow(
            name=job.name,
            phase=job.status,
            message=job.message,
            submitted_at=job.submitted_at,
            replicas=tuple(
                ReplicaRow(
                    name=key,
                    status=r.status,
                    restarts=r.restarts,
                    exit_code=r.exit_code,
                    log_tail=log_tail(store.log_path(job.name, key)),
                )
                for key, r in sorted(job.replicas.items(), key=lambda kv: (kv[1].role, kv[1].index))
            ),
        )
        for job in jobs
    ]


def reader(state_dir: Union[str, Path]) -> Callable[[], List[JobRow]]:
    """What `create_app(..., jobs=...)` takes: the jobs of `state_dir`, read afresh at each call."""
    store = JobStore(Path(state_dir))
    return lambda: job_rows(store)
