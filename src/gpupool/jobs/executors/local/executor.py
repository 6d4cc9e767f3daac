"""Run jobs as processes on this machine, one detached supervisor per job.

State lives in the pool state dir (see state.py), so every verb works
from another shell. The supervisor owns replicas and lease; cancel signals
it, and cleans up by itself when the supervisor was killed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import yaml

from ....core.errors import InvalidInput, Unsatisfiable
from ....core.placement import could_ever_fit
from ....pooling.isolation.proctree import alive
from ...environment import expand_command, redacted_env, replica_env
from ...phase import Phase
from ...plan import Endpoints, gang_claim, replicas, role_of
from ...spec import JobSpec, spec_to_dict
from ..base import DryRunInfo, Executor, JobDescription, ReplicaDescription
from . import ports, processes
from .state import JobState, JobStore, ReplicaState

CANCEL_WAIT_S = 20.0


class LocalExecutor(Executor):
    """Jobs as process groups under a supervisor, state under `state_dir/jobs`."""

    target = "local"
    poll_s = 0.2

    def __init__(
        self,
        state_dir: Optional[Path] = None,
        servers: Sequence[str] = (),
        ttl_s: float = 30.0,
        workdir: Optional[str] = None,
    ) -> None:
        self.store = JobStore(state_dir)
        self.servers = list(servers)
        self.ttl_s = ttl_s
        self.workdir = workdir or os.getcwd()
        # The supervisor this executor started (kept so --follow or a benchmark in this process can reap it).
        self.supervisor: Optional[subprocess.Popen[bytes]] = None

    # --- submit ----------------------------------------------------------------
    def dryrun(self, spec: JobSpec) -> DryRunInfo:
        reps = replicas(spec)
        # Ports and GPUs are picked when the job starts: show where they go.
        endpoints = Endpoints(
            {r.name: "127.0.0.1" for r in reps},
            {r.name: f"<port:{r.name}>" for r in reps},
            ("127.0.0.1", "<port:kvstore>") if spec.framework.value == "horovod" else None,
        )
        job_dir = str(self.store.job_dir(spec.name))
        claim = gang_claim(spec)
        planned: List[Dict[str, object]] = []
        plan: Dict[str, object] = {
            "job": spec.name,
            "target": self.target,
            "stateDir": job_dir,
            "workingDir": self._workdir(spec),
            "claim": claim.to_dict() if claim else None,
            "claimDescription": claim.describe() if claim else "no GPUs",
            "setup": list(spec.setup) or None,
            "replicas": planned,
        }
        for r in reps:
            gpu = {"CUDA_VISIBLE_DEVICES": f"<granted: group {r.group}>"} if r.group is not None else None
            # As people may read it (a log, a terminal): no secret of the spec's env, also not in a $(VAR) of the command.
            env = redacted_env(replica_env(spec, reps, endpoints, r, job_dir, gpu))
            planned.append(
                {
                    "name": r.name,
                    "rank": r.rank,
                    "command": list(expand_command(role_of(spec, r).command, env)),
                    "env": env,
                }
            )
        text = yaml.safe_dump(plan, sort_keys=False, default_flow_style=False, width=120)
        return DryRunInfo(self.target, spec, plan, text)

    def schedule(self, info: DryRunInfo) -> str:
        spec = info.spec
        self._check_fits(spec)
        state = JobState(
            name=spec.name,
            target=self.target,
            servers=self.servers,
            ttl_s=self.ttl_s,
            workdir=self._workdir(spec),
            replicas={r.name: ReplicaState(r.role, r.index) for r in replicas(spec)},
        )
        job_dir = self.store.create(spec.name, spec_to_dict(spec), state)
        with open(job_dir / "logs" / "supervisor.log", "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpupool.jobs.executors.local.supervisor", str(self.store.state_dir), spec.name],
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives this shell; cancel reaches it by pid
                cwd=state.workdir,
            )
        self.supervisor = proc
        return spec.name

    def _workdir(self, spec: JobSpec) -> str:
        return str(Path(self.workdir, spec.working_dir).resolve()) if spec.working_dir else self.workdir

    def _check_fits(self, spec: JobSpec) -> None:
        """Refuse at once a gang that no state of the pool could ever hold (waiting cannot help)."""
        claim = gang_claim(spec)
        if claim is None:
            return
        from ....workload.client.resolve import connect

        with connect(self.servers or None, self.store.state_dir) as client:
            devices = client.status().devices
        placement = could_ever_fit(devices, claim)
        if not placement.fits:
            raise Unsatisfiable(
                f"job {spec.name!r} can never run on this pool: {placement.reason}; "
                "lower the replicas' gpu fraction/memory or the replica count"
            )

    # --- inspect ---------------------------------------------------------------
    def describe(self, name: str) -> JobDescription:
        self._reap()
        return _description(self.store.load(name))

    def list(self) -> List[JobDescription]:
        self._reap()
        return [_description(s) for s in self.store.all()]

    def _reap(self) -> None:
        """Reap the supervisor this process started (submit --follow), so it is not left a zombie."""
        if self.supervisor is not None:
            self.supervisor.poll()

    def log_lines(self, name: str, replica: Optional[str] = None, follow: bool = False) -> Iterator[str]:
        state = self.store.load(name)
        if replica is not None:
            known = list(state.replicas) + ["setup", "supervisor"]
            if replica not in known:
                raise InvalidInput(f"job {name!r} has no replica {replica!r}: use one of {', '.join(known)}")
            names = [replica]
        else:
            names = list(state.replicas)
        prefix = replica is None and len(names) > 1
        paths = {n: self.store.log_path(name, n) for n in names}
        return _tail(paths, prefix, follow, lambda: self._finished(name))

    def _finished(self, name: str) -> bool:
        state = self.store.load(name)
        if state.phase.is_terminal:
            return True
        # A supervisor killed with -9 never writes a terminal state: stop following it.
        return bool(state.supervisor_pid) and not alive(state.supervisor_pid)

    # --- cancel ----------------------------------------------------------------
    def cancel(self, name: str) -> str:
        state = self.store.load(name)
        if state.phase.is_terminal:
            return f"job {name} already {state.status.lower()}"
        self.store.request_cancel(name)
        pid = state.supervisor_pid
        if pid and alive(pid):
            os.kill(pid, 15)
            end = time.monotonic() + CANCEL_WAIT_S
            while time.monotonic() < end:
                self._reap()
                if self.store.load(name).phase.is_terminal and not alive(pid):
                    return f"job {name} cancelled"
                time.sleep(0.1)
        return self._cleanup_orphaned(name)

    def _cleanup_orphaned(self, name: str) -> str:
        """The supervisor is gone (or hung): kill the job's processes and free its lease here."""
        state = self.store.load(name)
        if state.supervisor_pid and alive(state.supervisor_pid):
            processes.signal_group(state.supervisor_pid, 9)
            try:
                os.kill(state.supervisor_pid, 9)
            except ProcessLookupError:
                pass
        job_dir = self.store.job_dir(name)
        for pid in processes.marked_processes(job_dir):
            try:
                processes.signal_group(os.getpgid(pid), 9)
            except ProcessLookupError:
                pass
        killed = processes.sweep(job_dir)
        note = ""
        if state.lease_id:
            from ....core.errors import GpupoolError
            from ....workload.client.resolve import connect

            try:
                with connect(state.servers or None, self.store.state_dir) as client:
                    client.release(state.lease_id)
            except GpupoolError as err:
                note = f" (lease: {err.message})"
        ports.release(self.store.root, name)
        state.status, state.message = Phase.CANCELLED.value, "cancelled; supervisor was gone" + note
        state.finished_at = time.time()
        for rs in state.replicas.values():
            if not Phase.parse(rs.status).is_terminal:
                rs.status = Phase.STOPPED.value
        self.store.save(state)
        return f"job {name} cancelled (cleaned up {len(killed)} leftover process(es) itself)"


def _description(state: JobState) -> JobDescription:
    phase, message = state.phase, state.message
    if not phase.is_terminal and state.supervisor_pid and not alive(state.supervisor_pid):
        # Nobody is left to record an outcome: the job has failed, and its leftovers need a cancel.
        phase = Phase.FAILED
        message = f"supervisor (pid {state.supervisor_pid}) is gone; run gpupool cancel {state.name} to clean up"
    return JobDescription(
        name=state.name,
        target=state.target,
        status=phase,
        message=message,
        restarts=state.restarts,
        lease_id=state.lease_id,
        submitted_at=state.submitted_at,
        started_at=state.started_at,
        finished_at=state.finished_at,
        replicas=[
            ReplicaDescription(n, Phase.parse(r.status), r.exit_code, r.restarts, r.devices)
            for n, r in state.replicas.items()
        ],
    )


def _tail(paths: Dict[str, Path], prefix: bool, follow: bool, finished: Callable[[], bool]) -> Iterator[str]:
    """Lines of every file in `paths`; with `follow`, poll for more until `finished()`."""
    offsets = dict.fromkeys(paths, 0)
    partial = dict.fromkeys(paths, b"")
    while True:
        done = follow and finished()  # read once more after the job ended: nothing is lost
        for name, path in paths.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offsets[name])
                    chunk = f.read()
            except FileNotFoundError:
                continue
            offsets[name] += len(chunk)
            lines = (partial[name] + chunk).split(b"\n")
            partial[name] = lines.pop()
            for line in lines:
                text = line.decode("utf-8", "replace")
                yield f"[{name}] {text}" if prefix else text
        if not follow or done:
            for name, rest in partial.items():
                if rest:
                    text = rest.decode("utf-8", "replace")
                    yield f"[{name}] {text}" if prefix else text
            return
        time.sleep(0.2)
