"""The job supervisor: one process per local job, owning its gang lease and its replicas.

`python -m gpupool.jobs.executors.local.supervisor STATE_DIR NAME` runs setup, claims every
replica's GPUs as one gang claim (queued whole), starts the replicas with
their rendezvous and isolation env, heartbeats the lease, applies the restart
and success policies, and in every exit path stops the replicas and releases
the lease and ports. SIGTERM (what `gpupool cancel` sends) cancels the job.

A preempted lease (the job's queue borrowed GPUs that another queue needs back) requeues the job,
as Kueue does with its workloads: every replica gets SIGTERM (SIGKILL after the lease's grace),
the lease is released, the gang claims again, and the replicas start over with
GPUPOOL_PREEMPTED=1 and GPUPOOL_ATTEMPT=N (a checkpointing trainer resumes). A preemption is
no failure: it does not count against backoffLimit.
"""

from __future__ import annotations

import getpass
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Dict, List, Optional, Sequence

from ....core.errors import GpupoolError, Unavailable
from ....core.model import Holder, Lease
from ....logs import escaping_formatter
from ....pooling.isolation.env import ATTEMPT_ENV, HOOK_DIR_ENV, MPS_MEMORY_LIMIT_ENV, PREEMPTED_ENV
from ....pooling.isolation.proctree import alive
from ....workload.runner.child import exit_code  # Popen's -N as the shell's 128+N, as `gpupool run` exits
from ...environment import expand_command, job_env, replica_env
from ...lifecycle import Action, backoff_delay, decide
from ...phase import Phase
from ...plan import Endpoints, Replica, gang_claim, group_restart, local_endpoints, replicas, role_of
from ...spec import Framework, JobSpec, parse_spec
from . import ports, processes
from .state import JobState, JobStore

if TYPE_CHECKING:
    from ....workload.client.base import PoolClient
    from ....workload.runner.heartbeat import Heartbeat
    from ....workload.runner.preemption import PreemptionWatch
    from ...rendezvous.kvstore import KVStoreServer

log = logging.getLogger(__name__)
POLL_S = 0.2
TRAINER_GRACE_S = 30.0  # after success, how long other workers may take to finish on their own


class Cancelled(Exception):
    """Cancel was asked (SIGTERM or the cancel marker)."""


class JobFailed(Exception):
    """The job failed for a reason already worded for the user."""


class Supervisor:
    """Runs one job to a terminal state; `run()` returns the process exit code."""

    def __init__(self, store: JobStore, name: str) -> None:
        self.store = store
        self.name = name
        self.job_dir = store.job_dir(name)
        self.spec: JobSpec = parse_spec(store.load_spec(name))
        self.state: JobState = store.load(name)
        self.reps = replicas(self.spec)
        self.procs: Dict[str, subprocess.Popen[bytes]] = {}
        self.exits: Dict[str, Optional[int]] = {}
        self.logs: Dict[str, IO[bytes]] = {}  # replica name -> its log, open while it may run
        self.client: Optional[PoolClient] = None
        self.lease: Optional[Lease] = None
        self.heartbeat: Optional[Heartbeat] = None
        self.watch: Optional[PreemptionWatch] = None  # hears at once that the pool preempted the lease
        self.kvstore: Optional[KVStoreServer] = None
        self.endpoints: Optional[Endpoints] = None
        self.gpu_envs: Dict[str, Dict[str, str]] = {}
        self._cancel = False
        self._interruptible = False

    # --- entry -----------------------------------------------------------------
    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        self.state.supervisor_pid = os.getpid()
        self._save()
        try:
            self._run()
        except Cancelled:
            self._finish(Phase.CANCELLED, "cancelled")
        except JobFailed as err:
            self._finish(Phase.FAILED, str(err))
        except GpupoolError as err:
            self._finish(Phase.FAILED, err.message)
        except Exception as err:  # the job must still end in a state and free its GPUs
            log.exception("supervisor error")
            self._finish(Phase.FAILED, f"supervisor error: {err!r}")
        finally:
            self._cleanup()
        return 0 if self.state.status == Phase.SUCCEEDED.value else 1

    def _on_signal(self, signum: int, frame: object) -> None:
        log.info("signal %d: cancelling", signum)
        self._cancel = True
        if self._interruptible:
            raise Cancelled()

    def _check_cancel(self) -> None:
        if self._cancel or self.store.cancel_requested(self.name):
            raise Cancelled()

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            self._check_cancel()
            self._check_deadline()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(POLL_S, left))

    def _check_deadline(self) -> None:
        limit = self.spec.active_deadline_seconds
        if limit is not None and time.time() - self.state.submitted_at > limit:
            raise JobFailed(f"activeDeadlineSeconds {limit:g} exceeded")

    # --- phases ----------------------------------------------------------------
    def _run(self) -> None:
        self._check_cancel()
        if self.spec.setup:
            self._run_setup()
        host = "127.0.0.1"
        if self.spec.framework is Framework.HOROVOD:
            from ...rendezvous.kvstore import KVStoreServer

            self.kvstore = KVStoreServer(host).start()
        self.state.ports = ports.reserve(self.store.root, self.name, len(self.reps), self._job_live, host)
        base = local_endpoints(self.reps, self.state.ports, host)
        self.endpoints = Endpoints(
            base.hosts,
            base.ports,
            (host, self.kvstore.port) if self.kvstore is not None else None,
            self.kvstore.token if self.kvstore is not None else "",
        )
        self._save()
        self._claim()
        self.state.started_at = time.time()
        self._start_all()
        self._watch()

    def _start_all(self) -> None:
        self.state.status, self.state.message = Phase.RUNNING.value, ""
        for rep in self.reps:
            self._start(rep)
        self._save()

    def _run_setup(self) -> None:
        """The spec's setup command, once, before any GPU is claimed (downloads, exports)."""
        env = dict(_base_env(), **job_env(self.name, str(self.job_dir)), CUDA_VISIBLE_DEVICES="")
        env.update(self.spec.env)
        self.state.message = "running setup"
        self._save()
        with open(self.job_dir / "logs" / "setup.log", "ab") as out:
            proc = processes.start(expand_command(self.spec.setup, env), dict(env), out, self.state.workdir)
            try:
                while proc.poll() is None:
                    self._sleep(POLL_S)
            finally:
                if proc.poll() is None:
                    processes.stop_groups([proc.pid], children=[proc])
        if proc.returncode != 0:
            raise JobFailed(
                f"setup exited with {exit_code(proc.returncode)}; see gpupool logs {self.name} --replica setup"
            )

    def _claim(self, why: str = "") -> None:
        """One gang claim for every replica's GPUs: granted whole or queued whole (`why` leads the
        message shown while queued)."""
        claim = gang_claim(self.spec)
        if claim is None:
            return
        from ....core.outage import new_key
        from ....workload.client.resolve import claim_waiting, connect

        self.client = connect(self.state.servers or None, self.store.state_dir)
        holder = Holder(getpass.getuser(), os.getpid(), socket.gethostname(), f"job/{self.name}")
        key = new_key()  # one per claim: a try after a lost answer or a server restart finds what it got
        try:
            self.lease = self.client.claim(claim, holder, wait_s=0.0, ttl_s=self.state.ttl_s, key=key)
        except Unavailable as err:
            self.state.status, self.state.message = Phase.QUEUED.value, why + err.message
            self._save()
            limit = self.spec.active_deadline_seconds
            wait = 7 * 24 * 3600.0 if limit is None else max(0.0, limit - (time.time() - self.state.submitted_at))
            self._interruptible = True
            try:
                self._check_cancel()
                # A restart of the pool server keeps the job's place in its queue.
                deadline = time.monotonic() + wait
                self.lease = claim_waiting(self.client, claim, holder, deadline, self.state.ttl_s, key, log.warning)
            except Unavailable:
                raise JobFailed(f"activeDeadlineSeconds {limit:g} exceeded while queued for GPUs") from None
            finally:
                self._interruptible = False
        self.state.lease_id = self.lease.id
        self._save()
        from ....pooling.isolation import isolation_env, shares, write_hook_dir
        from ....workload.runner.attest import attest_lease

        # The replicas are this process's children: the node's watchdog counts them once it saw us attest.
        attest_lease(self.client, self.lease, log.warning)
        from ....workload.runner.heartbeat import Heartbeat
        from ....workload.runner.preemption import PreemptionWatch

        status = self.client.status()
        hook_dir = str(write_hook_dir(self.job_dir / "hook"))
        for rep in self.reps:
            if rep.group is not None:
                self.gpu_envs[rep.name] = isolation_env(
                    self.lease.id, shares(self.lease, status.devices, rep.group), hook_dir, isolation=status.isolation
                )
        # The watch only records the preemption: the main loop stops the replicas and requeues.
        self.watch = PreemptionWatch(self.client, self.lease.id, lambda lease: None)
        self.heartbeat = Heartbeat(
            self.client, self.lease.id, self.state.ttl_s / 3, log.warning, on_lease=self.watch.notice
        )
        self.heartbeat.start()
        self.watch.start()

    def _start(self, rep: Replica) -> None:
        """Start (or restart) one replica, appending to its log."""
        assert self.endpoints is not None
        attempt = self.state.replicas[rep.name].restarts
        extra = replica_env(
            self.spec, self.reps, self.endpoints, rep, str(self.job_dir), self.gpu_envs.get(rep.name), attempt
        )
        if self.state.preemptions:  # as `gpupool run --requeue` sets them for its rerun
            extra.update({PREEMPTED_ENV: "1", ATTEMPT_ENV: str(self.state.preemptions + 1)})
        env = _base_env()
        env.update(extra)
        hook = extra.get(HOOK_DIR_ENV)
        if hook:
            from ....pooling.isolation import child_env

            env = child_env(_base_env(), extra)
        command = expand_command(role_of(self.spec, rep).command, env)
        gpu_env = self.gpu_envs.get(rep.name) or {}
        if MPS_MEMORY_LIMIT_ENV in gpu_env:  # each start, restarts too: uncapped without the MPS daemon
            from ....workload.runner.mps_check import require_mps_daemon

            require_mps_daemon(gpu_env, self.state.lease_id, log.warning)  # NotCapped fails the job
        previous = self.logs.pop(rep.name, None)
        if previous is not None:  # a restart: the stopped attempt's handle is no longer needed
            previous.close()
        out = open(self.store.log_path(self.name, rep.name), "ab")  # noqa: SIM115  # held open while the replica runs
        self.logs[rep.name] = out
        out.write(f"=== gpupool: {rep.name} attempt {attempt + 1}: {' '.join(command)}\n".encode())
        out.flush()
        try:
            proc = processes.start(command, env, out, self.state.workdir)
        except OSError as err:
            raise JobFailed(
                f"cannot start {rep.name}: {err.strerror}: {command[0]!r}; check roles.{rep.role}.command"
            ) from None
        self.procs[rep.name] = proc
        self.exits[rep.name] = None
        rs = self.state.replicas[rep.name]
        rs.status, rs.pid, rs.exit_code = Phase.RUNNING.value, proc.pid, None
        rs.devices = extra.get("CUDA_VISIBLE_DEVICES", "")

    def _watch(self) -> None:
        """Poll replicas until the job succeeds, fails or is cancelled."""
        while True:
            self._check_cancel()
            self._check_deadline()
            if self.watch is not None and self.watch.preempted is not None:
                self._requeue(self.watch.preempted)
                continue
            if self.watch is not None and self.watch.gone is not None:  # released, or its token revoked
                raise JobFailed(self.watch.gone)
            if self.heartbeat is not None and self.heartbeat.lost:
                raise JobFailed(f"lease {self.state.lease_id} was lost (no heartbeat reached the pool in time)")
            changed = False
            for rep in self.reps:
                proc = self.procs.get(rep.name)
                if proc is None or self.exits.get(rep.name) is not None or proc.poll() is None:
                    continue
                code = exit_code(proc.returncode)
                self.exits[rep.name] = code
                rs = self.state.replicas[rep.name]
                rs.exit_code, rs.status = code, (Phase.SUCCEEDED if code == 0 else Phase.FAILED).value
                log.info("%s exited with %d", rep.name, code)
                changed = True
            if changed:
                self._save()
                decision = decide(self.spec, self.reps, self.exits, self.state.restarts)
                if decision.action is Action.SUCCEED:
                    self._wind_down()
                    self._finish(Phase.SUCCEEDED, decision.message)
                    return
                if decision.action is Action.FAIL:
                    raise JobFailed(decision.message)
                if decision.action is Action.RESTART:
                    self._restart(decision.replicas, decision.message)
            time.sleep(POLL_S)

    def _requeue(self, preempted: Lease) -> None:
        """Stop every replica, give the preempted lease back, claim again and start them all over."""
        from ....workload.runner.preemption import preemption_notice

        self.state.status = Phase.QUEUED.value
        self.state.message = preemption_notice(preempted, "the replicas") + ", then queueing again"
        log.warning(self.state.message)
        self._save()
        self._stop([r.name for r in self.reps], grace_s=preempted.preempt_grace_s)
        for rep in self.reps:
            rs = self.state.replicas[rep.name]
            rs.status, rs.pid = Phase.PENDING.value, 0
        self.procs.clear()
        self.exits.clear()
        self._give_back_lease()
        self.state.preemptions += 1
        self._save()
        self._claim(why=f"preempted {self.state.preemptions}x, queued again: ")
        self._start_all()

    def _restart(self, targets: Sequence[Replica], message: str) -> None:
        delay = backoff_delay(self.spec, self.state.restarts)
        self.state.restarts += 1
        self.state.status = Phase.RESTARTING.value
        self.state.message = f"{message} in {delay:g}s (restart {self.state.restarts}/{self.spec.backoff_limit})"
        log.warning(self.state.message)
        self._stop([r.name for r in targets])
        for rep in targets:
            rs = self.state.replicas[rep.name]
            rs.restarts += 1
            rs.status = Phase.PENDING.value
        self._save()
        self._sleep(delay)
        for rep in targets:
            self._start(rep)
        self.state.status, self.state.message = Phase.RUNNING.value, ""
        self._save()

    def _wind_down(self) -> None:
        """After success: give unfinished workers a grace period, then stop everyone left.

        Only collective jobs get the grace (their workers end together); the
        workers of ParameterServerStrategy are servers and never end by themselves.
        """
        end = time.monotonic() + (TRAINER_GRACE_S if group_restart(self.spec) else 0.0)
        waiting = [r for r in self.reps if not r.is_service and self.exits.get(r.name) is None]
        while waiting and time.monotonic() < end:
            time.sleep(POLL_S)
            waiting = [r for r in waiting if self.procs[r.name].poll() is None]
        self._stop([r.name for r in self.reps])

    def _stop(self, names: List[str], grace_s: float = 5.0) -> None:
        procs = [self.procs[n] for n in names if n in self.procs]
        processes.stop_groups([p.pid for p in procs], grace_s=grace_s, children=procs)
        for n in names:
            proc = self.procs.get(n)
            if proc is None:
                continue
            rs = self.state.replicas[n]
            if self.exits.get(n) is None and proc.returncode is not None:
                self.exits[n] = exit_code(proc.returncode)
                rs.exit_code, rs.status = self.exits[n], Phase.STOPPED.value

    # --- end -------------------------------------------------------------------
    def _finish(self, status: Phase, message: str) -> None:
        self.state.status, self.state.message = status.value, message
        self.state.finished_at = time.time()
        log.info("job %s %s: %s", self.name, status.value, message)

    def _cleanup(self) -> None:
        """Every exit path: no replica left running, lease and ports given back."""
        try:
            self._stop(list(self.procs))
            processes.sweep(self.job_dir)
        finally:
            self._give_back_lease()
            if self.kvstore is not None:
                self.kvstore.stop()
            ports.release(self.store.root, self.name)
            for f in self.logs.values():
                f.close()
            if not self.state.phase.is_terminal:
                self._finish(Phase.FAILED, self.state.message or "supervisor stopped")
            self._save()

    def _give_back_lease(self) -> None:
        """Stop the heartbeat and the watch, release the lease, close the pool's client."""
        if self.watch is not None:
            self.watch.stop()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.lease is not None and self.client is not None:
            try:
                self.client.release(self.lease.id)
            except GpupoolError as err:  # expired already: nothing is held
                log.warning("release of lease %s: %s", self.lease.id, err.message)
        if self.client is not None:
            self.client.close()  # also ends a watch in flight
        self.watch = self.heartbeat = None
        self.lease = self.client = None

    def _save(self) -> None:
        self.store.save(self.state)

    def _job_live(self, name: str) -> bool:
        """Whether job `name` may still use its ports (used to drop stale reservations)."""
        try:
            other = self.store.load(name)
        except GpupoolError:
            return False
        return not other.phase.is_terminal and alive(other.supervisor_pid)


def _base_env() -> Dict[str, str]:
    """The supervisor's env, with this Python's bin dir first on PATH: `python` and
    `gpupool` in a spec mean the installation that runs the job, venv or not."""
    env = dict(os.environ)
    bindir = os.path.dirname(sys.executable)
    path = env.get("PATH", "").split(os.pathsep)
    if bindir not in path:
        env["PATH"] = os.pathsep.join([bindir] + [p for p in path if p])
    return env


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m gpupool.jobs.executors.local.supervisor STATE_DIR JOB_NAME", file=sys.stderr)
        return 2
    store = JobStore(Path(args[0]))
    handler = logging.FileHandler(store.job_dir(args[1]) / "logs" / "supervisor.log")
    handler.setFormatter(escaping_formatter("%(asctime)s %(levelname)s %(message)s"))  # one line per record
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    return Supervisor(store, args[1]).run()


if __name__ == "__main__":
    sys.exit(main())
