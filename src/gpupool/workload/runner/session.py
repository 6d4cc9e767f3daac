"""`gpupool run`: claim, isolate, supervise the child, release on every exit path."""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ...core.errors import GpupoolError, LeaseLost, NotFound, Preempted, ServerUnreachable, TimeLimit
from ...core.isolation_mode import IsolationMode
from ...core.model import MAX_WAIT_S, Claim, Holder, Lease, local_user
from ...core.quantity import format_duration, format_mib
from ...logs import get_logger
from ...pooling.devices.health import is_emulated
from ...pooling.isolation import child_env, isolation_env, shares, write_hook_dir
from ...pooling.isolation.emulated_usage import usage_file
from ...pooling.isolation.env import ATTEMPT_ENV, EMULATED_USAGE_ENV, PREEMPTED_ENV
from ..client.base import PoolClient
from ..client.resolve import choose_and_claim, connect_all, pool_line
from .attest import attest_lease
from .child import Interrupted, SignalRelay, Terminal, exit_code, start
from .guard import Guard
from .heartbeat import Heartbeat
from .prctl import become_subreaper, parent_death_signal
from .tree import end_tree, reap_all, reap_orphans
from .workdir import make_workdir, remove_tree

if TYPE_CHECKING:
    from typing import Callable, List, Optional, Sequence, Set, Tuple

    from ...pooling.isolation.cgroup import LeaseCgroup
    from .child import Child
    from .preemption import PreemptionWatch
    from .waitline import WaitLine

log = get_logger(__name__)

# A rerun's claim against a pool server that does not answer is tried again this often.
RECLAIM_RETRY_S = 2.0


def _silent(line: str) -> None:
    """A progress printer that prints nothing."""


class RunOptions(NamedTuple):
    """Everything `gpupool run` needs besides the command."""

    claim: Claim
    wait_s: float = 0.0
    ttl_s: float = 30.0
    label: str = ""
    servers: Optional[List[str]] = None
    state_dir: Optional[Path] = None
    devices_spec: Optional[str] = None
    token_file: Optional[Path] = None  # --token-file: the token to send, over $GPUPOOL_TOKEN and the bundle's
    ca_file: Optional[Path] = None  # --ca: the CA to trust, over the bundle's and $GPUPOOL_CA
    isolation: Optional[IsolationMode] = None  # set the embedded pool's mode; None keeps the stored one
    quiet: bool = False
    say: Callable[[str], None] = _silent
    # What a lost lease does to the command: "kill" ends its tree, "warn" only says so.
    on_lease_loss: str = "kill"
    # SIGTERM to SIGKILL, when the tree is ended (release, lost lease, the guard after kill -9).
    grace_s: float = 0.5
    # Lines shown even when quiet (the lost-lease notice); None: `say`.
    warn: Optional[Callable[[str], None]] = None
    # When the lease is preempted: claim again and rerun the command (else exit Preempted.exit_code).
    requeue: bool = False
    # What parks the command when its lease is suspended (isolation/checkpoint.BACKENDS).
    suspend_backend: str = "auto"
    # --time: the command's wall-time limit in seconds from its start (each attempt's); None: none.
    time_s: Optional[float] = None
    # --latency-sensitive: on an `mps` node the command's kernels go before other leases'.
    latency_sensitive: bool = False


def progress(quiet: bool) -> Callable[[str], None]:
    """A printer of 'gpupool: ...' lines on stderr; warnings are shown even when quiet."""

    def say(line: str) -> None:
        if quiet and not line.lower().startswith("warning"):
            return
        print(f"gpupool: {line}", file=sys.stderr, flush=True)

    return say


def current_holder(label: str = "") -> Holder:
    """This process as a lease holder (a server replaces the name with its token's name)."""
    return Holder(name=local_user(), pid=os.getpid(), host=os.uname().nodename, label=label)


def run(command: Sequence[str], options: RunOptions) -> int:
    """Run `command` on a share of the pool; returns the exit code for the runner to exit with.

    A preempted lease stops the command; with `options.requeue` the same claim queues again and
    the command reruns (attempt 2, 3, ...) until an attempt ends without a preemption.
    """
    relay = SignalRelay().install()
    terminal = Terminal()
    clients: List[PoolClient] = []
    try:
        clients = connect_all(
            options.servers,
            options.state_dir,
            options.devices_spec,
            options.isolation,
            options.token_file,
            options.ca_file,
        )
        options.say(pool_line([c.address for c in clients]))  # the first line: which pool(s) the run uses
        attempt = 1
        while True:
            outcome = _run_once(clients, command, options, relay, terminal, attempt)
            if outcome.preempted is None:
                return outcome.code
            if relay.received:  # the user stopped it meanwhile: do not queue again
                return outcome.code
            if not _reruns(outcome.preempted, options.requeue):
                (options.warn or options.say)(
                    f"the command was stopped by the preemption of lease {outcome.preempted.id}; "
                    f"exit code {Preempted.exit_code} (use --requeue to queue again and rerun it)"
                )
                return Preempted.exit_code
            attempt += 1
            relay.resume()
    except Interrupted as interrupt:  # while connecting, before any claim
        options.say(f"Interrupted by signal {interrupt.signum} before the command started")
        return exit_code(-interrupt.signum)
    finally:
        relay.quiet()
        for c in clients:
            try:
                c.close()
            except Exception:  # closing must not hide the real outcome
                log.debug("close failed", exc_info=True)
        relay.restore()


def _reruns(preempted: Lease, requeue: bool) -> bool:
    """Whether a preempted command runs again: with --requeue, or when the preemption's mode is
    requeue (a queue's `--preempt requeue`, or a suspend its node could not do)."""
    from ...core.suspension import PREEMPT_REQUEUE  # lazily: only after a preemption

    mode = preempted.suspension.mode if preempted.suspension is not None else ""
    return requeue or mode == PREEMPT_REQUEUE


class _Outcome(NamedTuple):
    """How one attempt ended: the exit code, and the lease if a preemption stopped the command."""

    code: int
    preempted: Optional[Lease] = None


def _run_once(
    clients: List[PoolClient],
    command: Sequence[str],
    options: RunOptions,
    relay: SignalRelay,
    terminal: Terminal,
    attempt: int,
) -> _Outcome:
    """Claim, run the command once, release on every exit path."""
    say = options.say
    warn = options.warn or say
    claim = options.claim
    client: Optional[PoolClient] = None
    lease: Optional[Lease] = None
    workdir: Optional[Path] = None
    heartbeat: Optional[Heartbeat] = None
    watch: Optional[PreemptionWatch] = None
    guard: Optional[Guard] = None
    child: Optional[Child] = None
    code: Optional[int] = None  # the command's exit code, said at the release (the lease history keeps it)
    limit: Optional[_TimeLimit] = None  # --time's timer, started with the command
    timed_out = False  # the limit ended the command: the history says timeout
    subreaper = False
    try:
        addresses = ", ".join(c.address for c in clients)
        # A rerun after a preemption queues as long as it takes: its queue gets the GPUs back in time.
        wait_s = options.wait_s if attempt == 1 else MAX_WAIT_S
        queue = f", queue {claim.queue}" if claim.queue else ""
        say(
            f"Requested resources: {claim.describe()} ({claim.policy.value}{queue}); "
            f"lease TTL {options.ttl_s:g}s, queue wait {wait_s:g}s" + (f"; attempt {attempt}" if attempt > 1 else "")
        )
        say(f"Choosing GPUs from server list [{addresses}]")
        if attempt == 1 and claim.queue and len(clients) == 1:  # a --time over the queue's max: refused before it waits
            _queue_time_limit(clients[0], claim.queue, options.time_s)
        if attempt == 1:
            client, lease = _claim(clients, claim, options, say, wait_s)
        else:
            client, lease = _claim_again(clients, claim, options, say)
        # The queue the pool put the lease in (a token may bind one) sets the default and the maximum.
        time_s, time_source = options.time_s, "--time"
        if lease.queue:
            time_s = _queue_time_limit(client, lease.queue, options.time_s)
            if options.time_s is None and time_s is not None:
                time_source = f"queue {lease.queue}'s default"
        attest_lease(client, lease, warn)  # before the command starts: the node's watchdog then sees its tree
        # Orphans of an unguarded child re-parent to the runner (the guard's, to the guard).
        subreaper = become_subreaper()
        status = client.status()
        gpus = shares(lease, status.devices)
        workdir = make_workdir(lease.id)
        contract = isolation_env(
            lease.id,
            gpus,
            str(write_hook_dir(workdir / "hook")),
            isolation=status.isolation,
            latency_sensitive=options.latency_sensitive,
        )
        if attempt > 1:
            contract = {**contract, PREEMPTED_ENV: "1", ATTEMPT_ENV: str(attempt)}
        emulated = bool(lease.slices) and all(is_emulated(s.device_uuid) for s in lease.slices)
        usage = usage_file(status.emulated_usage)
        if emulated and usage:  # the command reports its usage where the pool samples it
            contract = {**contract, EMULATED_USAGE_ENV: usage}
        config_file = workdir / "lease.json"
        config_file.write_text(
            json.dumps({"server": client.address, "lease": lease.to_dict(), "env": contract}, indent=2)
        )
        sizes = ", ".join(f"{format_mib(g.memory_mib)} ({g.fraction:g})" for g in gpus)
        say(
            f"Locked {len(gpus)} GPUs with partial memory [{sizes}] on {client.address} as lease {lease.id}, "
            f"configuration saved to {config_file}"
        )
        if status.isolation.mode is IsolationMode.MPS:  # only then: other runs pay no import, no subprocess
            from .mps_check import require_mps_daemon

            # Right before the start: without a daemon CUDA would run the command uncapped (NotCapped).
            require_mps_daemon(contract, lease.id, warn)
        say(f"Running client command '{_join(command)}' on GPUs [{contract['CUDA_VISIBLE_DEVICES']}]")
        # The guard (a fork: before any thread exists) starts the command as its subreaper parent,
        # in the lease's cgroup where it can, and ends the lease's processes if the runner is killed.
        # Unguarded, the command gets SIGKILL from the kernel the moment the runner dies.
        env = child_env(os.environ, contract)
        guard = Guard.spawn(lease.id, options.grace_s, command, env, workdir)
        child = guard.child() if guard is not None else start(command, env, parent_death_signal())
        relay.child = child
        keep = {child.pid} | ({guard.pid} if guard is not None else set())
        cgroup = guard.cgroup if guard is not None else None  # the tree's container, where there is one
        ends = options.on_lease_loss == "kill"
        on_gone = _ender(child.pid, keep, options.grace_s, warn, cgroup) if ends else _lease_gone_warning(warn)
        # Imported here, after the command started: `gpupool run`'s start-up stays as light as it was.
        from .preemption import PreemptionWatch
        from .suspender import Suspender

        suspender = Suspender(
            client, lease.id, child.pid, keep - {child.pid}, options.suspend_backend, warn, usage, emulated
        )
        # One path for what the pool does to the lease: the watch hears a preemption, a suspension
        # and the lease's end (a release, its token revoked) at once; the heartbeat is the fallback.
        watch = PreemptionWatch(client, lease.id, _preempt_stopper(child.pid, keep, warn, cgroup), suspender, on_gone)
        if time_s is not None:  # the wall-time limit ends the tree as a release does
            limit = _time_limit(time_s, child.pid, keep, options.grace_s, warn, cgroup, time_source)
        heartbeat = Heartbeat(
            client,
            lease.id,
            options.ttl_s / 3,
            say,
            on_lost=watch.notice_gone,
            on_beat=lambda: reap_orphans(keep),
            on_lease=watch.notice,
        )
        heartbeat.start()
        watch.start()
        terminal.give(child.pid)
        returncode = child.wait()
        code = exit_code(returncode)
        terminal.take_back()
        if limit is not None:
            limit.cancel()
            if limit.fired:
                limit.join(options.grace_s + 5)  # its SIGKILL round is done before the release
                timed_out = True
                return _Outcome(TimeLimit.exit_code)
        if watch.preempted is not None:
            watch.join_stopper(watch.preempted.preempt_grace_s + 5)
            return _Outcome(exit_code(returncode), watch.preempted)
        if watch.gone is not None and ends:
            watch.join_stopper(options.grace_s + 5)
            return _Outcome(LeaseLost.exit_code)
        if watch.gone is not None:
            say(f"warning: the command finished, but lease {lease.id} had ended while it ran")
        code = exit_code(returncode)
        if returncode < 0:
            say(f"Client command was killed by signal {-returncode} (exit code {code})")
        return _Outcome(code)
    except Interrupted as interrupt:
        if child is not None and child.poll() is None:  # the signal beat `relay.child = child`
            os.killpg(child.pid, interrupt.signum)
            return _Outcome(exit_code(child.wait()))
        say(f"Interrupted by signal {interrupt.signum} before the command started")
        return _Outcome(exit_code(-interrupt.signum))  # as if the command had died of it
    finally:
        relay.quiet()
        terminal.take_back()
        if watch is not None:
            watch.stop()
        if heartbeat is not None:
            heartbeat.stop()
        if child is not None:
            _end_run_tree(child, guard, options.grace_s, None if subreaper else lease)
        elif guard is not None:  # it may have started the command: it ends it, before the release
            guard.abort()
        if limit is not None:
            limit.cancel()
        _release(client, lease, workdir, say, code, timed_out)
        if guard is not None:  # after the release: a runner killed in it still has its folder removed
            guard.done()
            guard.collect()
        if watch is not None and watch.preempted is not None and watch.is_alive():
            # A rerun follows only a preemption, after which the watch ends at once: no thread of
            # this attempt outlives it into the next one's guard fork. Otherwise it is not waited
            # for (it would notice the release only at its next poll, up to 0.1 s on every run):
            # closing the client ends it.
            watch.join(timeout=2.0)


def _claim(
    clients: List[PoolClient], claim: Claim, options: RunOptions, say: Callable[[str], None], wait_s: float
) -> Tuple[PoolClient, Lease]:
    """`claim` as this run asks it: its holder and TTL, its progress lines and its waiting view."""
    return choose_and_claim(
        clients,
        claim,
        current_holder(options.label),
        wait_s=wait_s,
        ttl_s=options.ttl_s,
        progress=say,
        waiting_view=_waiting_view(options),
    )


def _claim_again(
    clients: List[PoolClient], claim: Claim, options: RunOptions, say: Callable[[str], None]
) -> Tuple[PoolClient, Lease]:
    """The rerun's claim: queue as long as it takes, and ride out a pool server that is down for a
    while (restarting after a crash): the work must not be dropped for that."""
    told = False
    while True:
        try:
            return _claim(clients, claim, options, say, MAX_WAIT_S)
        except ServerUnreachable as err:
            if not told:
                say(f"warning: {err.message}; trying again every {RECLAIM_RETRY_S:g}s")
                told = True
            time.sleep(RECLAIM_RETRY_S)


def _preempt_stopper(
    pgid: int, keep: Set[int], warn: Callable[[str], None], cgroup: Optional[LeaseCgroup] = None
) -> Callable[[Lease], None]:
    """What the watch does when the lease is preempted: say so, SIGTERM the command's tree,
    SIGKILL what is left after the lease's grace. The main thread's child.wait() then returns."""

    def stop(lease: Lease) -> None:
        from .preemption import preemption_notice  # imported already: the watch calling this lives there

        warn(preemption_notice(lease, "the command"))
        _signal_tree(pgid, keep, lease.preempt_grace_s, "after the preemption", cgroup)

    return stop


def _ender(
    pgid: int, keep: Set[int], grace_s: float, warn: Callable[[str], None], cgroup: Optional[LeaseCgroup] = None
) -> Callable[[str], None]:
    """What the watch does when the lease ends under the command (released by its owner or an
    admin, its token revoked, expired): say how, as the pool tells it (`why`), and end the whole
    tree. The main thread's child.wait() then returns, and the runner exits with LeaseLost.exit_code."""

    def end(why: str) -> None:
        warn(
            f"{why}: ending the command (SIGTERM, SIGKILL after {grace_s:g}s), exit code {LeaseLost.exit_code}; "
            "use --on-lease-loss warn to keep it running"
        )
        _signal_tree(pgid, keep, grace_s, "after the lease ended", cgroup)

    return end


class _TimeLimit(threading.Timer):
    """--time's timer: when it fires, says so and ends the command's whole tree as a release does
    (the lease's cgroup frozen and signalled, SIGKILL after the grace); `fired` then is True."""

    fired = False


def _time_limit(
    limit_s: float,
    pgid: int,
    keep: Set[int],
    grace_s: float,
    warn: Callable[[str], None],
    cgroup: Optional[LeaseCgroup] = None,
    source: str = "--time",
) -> _TimeLimit:
    """Start the timer of the wall-time limit (`source`: --time or the queue's default) for the command just started."""

    def end() -> None:
        timer.fired = True
        warn(
            f"time limit {format_duration(limit_s)} reached ({source}): ending the command "
            f"(SIGTERM, SIGKILL after {grace_s:g}s), exit code {TimeLimit.exit_code}"
        )
        _signal_tree(pgid, keep, grace_s, "at the time limit", cgroup)

    timer = _TimeLimit(limit_s, end)
    timer.daemon = True
    timer.start()
    return timer


def _queue_time_limit(client: PoolClient, queue: str, asked: Optional[float]) -> Optional[float]:
    """The run's wall-time limit in `queue` (core.queues.QueueSpec.time_limit): --time up to the
    queue's max time, else its default; InvalidInput (exit 2) for a --time above the max."""
    for status in client.queues():
        if status.spec.name == queue:
            return status.spec.time_limit(asked)
    return asked


def _lease_gone_warning(warn: Callable[[str], None]) -> Callable[[str], None]:
    """What the watch does when the lease ends under the command with --on-lease-loss warn: say so, loudly."""

    def told(why: str) -> None:
        warn(
            f"WARNING: {why}; the command still runs without a lease (--on-lease-loss warn): "
            "its GPUs may be given to someone else"
        )

    return told


def _signal_tree(pgid: int, keep: Set[int], grace_s: float, why: str, cgroup: Optional[LeaseCgroup] = None) -> None:
    """End the command's tree from a watcher thread: SIGTERM, SIGKILL after `grace_s`; the lease's
    cgroup first, frozen while it is signalled (a walk of /proc cannot outrun a tree that forks).

    Only signals: the main thread alone waits for (reaps) the child, so its pid stays ours. A
    failure is logged, not raised: the main thread's release path ends the tree again.
    """
    try:
        if cgroup is not None:
            cgroup.terminate(grace_s)
        end_tree(pgid, grace_s, exclude=keep - {pgid})
    except Exception:
        log.exception("ending the tree %s", why)


def _end_run_tree(child: Child, guard: Optional[Guard], grace_s: float, lease: Optional[Lease]) -> None:
    """End everything the command left (background jobs, daemons) before the lease is released,
    then reap it. `lease` is given where there is no subreaper: its env finds the orphans then."""
    exclude = {guard.pid} if guard is not None else set()
    lease_id = lease.id if lease is not None else None
    try:
        if guard is not None and guard.cgroup is not None:  # all of it at once, frozen while signalled
            guard.cgroup.terminate(grace_s)
        if child.poll() is None:  # an error left it running: end it first, so wait() cannot hang
            end_tree(child.pid, grace_s, exclude=exclude, lease_id=lease_id)
            child.wait(timeout=5)
        end_tree(child.pid, grace_s, exclude=exclude, lease_id=lease_id)
    except Exception:  # the release must happen whatever went wrong here
        log.exception("ending the command's process tree")
    finally:
        if guard is not None:
            guard.end_cgroup()  # what no tree walk found (the guard died): the kernel knows
        reap_all()


def _waiting_view(options: RunOptions) -> Optional[Callable[[PoolClient, str], WaitLine]]:
    """What shows the claim's place while it waits (on stderr, beside the progress lines); none when quiet."""
    if options.quiet:
        return None

    def start(client: PoolClient, key: str) -> WaitLine:
        from .waitline import WaitLine  # only once the claim queues: most runs never wait

        return WaitLine.starter(sys.stderr)(client, key)

    return start


def _release(
    client: Optional[PoolClient],
    lease: Optional[Lease],
    workdir: Optional[Path],
    say: Callable[[str], None],
    code: Optional[int] = None,
    timed_out: bool = False,
) -> None:
    if client is None or lease is None:
        return
    where = workdir / "lease.json" if workdir is not None else lease.id
    say(f"Releasing GPUs from config file {where}")
    released = 0
    try:
        if timed_out:
            client.release(lease.id, code, timed_out=True)
        else:
            client.release(lease.id, code)
        released = 1
    except NotFound as err:
        say(f"warning: lease {lease.id} was already gone ({err.message})")
    except GpupoolError as err:
        say(f"warning: could not release lease {lease.id} ({err.message}); it expires after {lease.ttl_s:g}s")
    except Exception as err:  # the lease expires anyway; the user must hear why it lingers
        say(f"warning: could not release lease {lease.id} ({err!r}); it expires after {lease.ttl_s:g}s")
    if workdir is not None:
        remove_tree(workdir)
    say(f"Released GPUs on {released} servers and removed generated config file")


def _join(command: Sequence[str]) -> str:
    return " ".join(shlex.quote(c) for c in command)
