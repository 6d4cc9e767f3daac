"""`gpupool run -n N (-p FRACTION | -m MiB) ... -- CMD`: run a command on a share of the pool."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .pool_options import add_pool_arguments, pool_kwargs

if TYPE_CHECKING:
    from typing import Callable

    from ..core.model import Claim

EXAMPLES = """examples:
  gpupool run -n 1 -p 0.5 -- python train.py
  gpupool run -n 2 -m 8GiB --filter 'device.name=*A100*' --wait 600 -- python train.py

  gpupool run --queue team-a --requeue --preempt-grace 60 -- gpupool train --data d --out runs/a

The command's whole process tree (background jobs and daemons included) ends before the lease is
released, also when the runner is killed (kill -9). A lost lease ends the command with exit code 6
unless --on-lease-loss warn. A preempted lease (its queue borrowed GPUs another queue needs back)
stops the command (SIGTERM, SIGKILL after the grace) and exits 8, or with --requeue claims again
and reruns it with GPUPOOL_PREEMPTED=1 and GPUPOOL_ATTEMPT=2, 3, ...
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `run`."""
    p = subparsers.add_parser(
        "run",
        help="run a command on N GPUs, each a fraction or a memory size",
        description="Claim GPUs from the pool, run CMD with them, release them when CMD ends.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-n", "--num-gpus", type=int, default=None, metavar="N", help="number of GPUs (default 1)")
    share = p.add_mutually_exclusive_group()
    share.add_argument("-p", "--partial", metavar="FRACTION", help="share of each GPU's memory in (0, 1], e.g. 0.5")
    share.add_argument("-m", "--memory", metavar="MiB", help="memory per GPU: MiB or a size such as 8GiB")
    p.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="device.name=GLOB, device.uuid=ID, device.index=I, device.memory>=SIZE, server.addr=HOST (repeatable)",
    )
    p.add_argument(
        "--policy",
        default=None,
        help="fragaware (default: where the GPUs' fragmentation grows least against the claims seen; "
        "binpack until there are some), binpack (keep whole GPUs free) or spread",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds to queue when the pool is full (default 0: fail at once, exit 3)",
    )
    p.add_argument(
        "--ttl", type=float, default=30.0, metavar="S", help="lease TTL; heartbeats every TTL/3 (default 30)"
    )
    p.add_argument(
        "--on-lease-loss",
        choices=("kill", "warn"),
        default="kill",
        help="when the lease ends under the command (released by its owner or an admin, its token revoked, "
        "expired): kill ends the command at once and exits 6 (default), warn only says so and lets it run on",
    )
    p.add_argument(
        "--isolation",
        choices=("mps", "hooks", "none"),
        default=None,
        help="set the embedded pool's isolation mode (mps starts a detached MPS control daemon for the "
        "state dir); default: the mode it has (hooks on a new pool)",
    )
    p.add_argument("--queue", default="", metavar="NAME", help="the team queue to claim in (`gpupool queue list`)")
    p.add_argument("--priority", default="0", metavar="N", help="order inside the queue: higher first (default 0)")
    p.add_argument(
        "--requeue",
        action="store_true",
        help="when the lease is preempted: claim again, waiting as long as it takes, and rerun the command "
        "(with GPUPOOL_PREEMPTED=1, GPUPOOL_ATTEMPT=N); without it a preemption exits 8",
    )
    p.add_argument(
        "--preempt-grace",
        default=None,
        metavar="S",
        help="seconds between SIGTERM and SIGKILL when preempted (default: the pool's, 30)",
    )
    p.add_argument(
        "--idle-suspend",
        default=None,
        metavar="DURATION",
        help="suspend the lease once its processes kept its GPUs 0%% busy this long (e.g. 10m; the watchdog of "
        "a server or node agent samples it); `gpupool resume LEASE_ID` brings it back",
    )
    p.add_argument(
        "--time",
        default=None,
        metavar="DURATION",
        help="wall-time limit from the command's start (e.g. 2h, 90m, 3600), as Slurm's --time: past it the "
        "command's whole tree is ended, the run exits 12 and the history says timeout",
    )
    p.add_argument(
        "--latency-sensitive",
        action="store_true",
        help="on a node in mps isolation, the command's kernels go before those of other leases on its GPUs "
        "(MPS client priority: the others run below normal); elsewhere it changes nothing",
    )
    p.add_argument("--label", default="", metavar="TEXT", help="free text shown in `gpupool status`")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines (warnings still shown)")
    add_pool_arguments(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command to run")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..core.errors import InvalidInput
    from ..core.isolation_mode import IsolationMode
    from ..core.model import (
        MAX_TTL_S,
        MAX_WAIT_S,
        MIN_TTL_S,
        Claim,
        GpuRequest,
        Policy,
        check_label,
        check_queue_name,
    )
    from ..core.quantity import parse_fraction, parse_memory_mib
    from ..workload.runner import RunOptions, progress, run

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise InvalidInput("no command to run: put it after --, e.g. gpupool run -n 1 -p 0.5 -- python train.py")
    if not 0 <= args.wait <= MAX_WAIT_S:  # also refuses nan; inf is over the limit
        raise InvalidInput(f"--wait {args.wait:g} must be between 0 and {MAX_WAIT_S:g} seconds (7 days)")
    if not MIN_TTL_S <= args.ttl <= MAX_TTL_S:
        raise InvalidInput(f"--ttl {args.ttl:g} must be between {MIN_TTL_S:g} and {MAX_TTL_S:g} seconds, e.g. --ttl 30")
    say = progress(args.quiet)
    filters = []
    if args.filter:  # only then: a run without --filter never loads core.filters
        from ..core.filters import Filter

        filters = [Filter.parse(f) for f in args.filter]
    decided = _decided_claim(args, say)
    if decided is not None:  # in a pod: the claim decided for the container, not flags read again
        requests = tuple(
            GpuRequest(r.count, r.fraction, r.memory_mib, (*r.filters, *filters)) for r in decided.requests
        )
        policy = decided.policy if args.policy is None else Policy.parse(args.policy)
    else:
        fraction = parse_fraction(args.partial, what="-p") if args.partial is not None else None
        memory = parse_memory_mib(args.memory, what="-m") if args.memory is not None else None
        if fraction is None and memory is None:
            fraction = 1.0  # a whole GPU, as Bitfusion's default
        requests = (GpuRequest(1 if args.num_gpus is None else args.num_gpus, fraction, memory, tuple(filters)),)
        policy = Policy.parse(args.policy or Policy.FRAGAWARE.value)
    claim = Claim(
        requests,
        policy,
        queue=check_queue_name(args.queue, InvalidInput) if args.queue else "",
        priority=parse_priority(args.priority),
        preempt_grace_s=_grace(args.preempt_grace),
        idle_suspend_s=_idle(args.idle_suspend),
    )
    options = RunOptions(
        claim=claim,
        wait_s=args.wait,
        ttl_s=args.ttl,
        label=check_label(args.label),
        quiet=args.quiet,
        say=say,
        on_lease_loss=args.on_lease_loss,
        requeue=args.requeue,
        warn=progress(False),
        isolation=IsolationMode.parse(args.isolation) if args.isolation else None,
        time_s=_time(args.time),
        latency_sensitive=args.latency_sensitive,
        suspend_backend=_suspend_backend(),
        **pool_kwargs(args),
    )
    return run(command, options)


def _suspend_backend() -> str:
    """$GPUPOOL_SUSPEND_BACKEND, checked at the start (not at the first suspension); "auto" unset."""
    import os

    from ..core.errors import InvalidInput
    from ..pooling.isolation.env import SUSPEND_BACKEND_ENV, SUSPEND_BACKENDS

    name = os.environ.get(SUSPEND_BACKEND_ENV, "").strip().lower() or "auto"
    if name not in SUSPEND_BACKENDS:
        raise InvalidInput(
            f"{SUSPEND_BACKEND_ENV}={name!r} is not one of {', '.join(SUSPEND_BACKENDS)}: set one or unset it"
        )
    return name


def _decided_claim(args: argparse.Namespace, say: Callable[[str], None]) -> Claim | None:
    """$GPUPOOL_CLAIM's claim (runner.podclaim) when no -n/-p/-m flag gives the share: inside a pod,
    the one the webhook and the extender's bind decided for the container. None elsewhere."""
    import os

    from ..pooling.isolation.env import CLAIM_ENV

    if args.num_gpus is not None or args.partial is not None or args.memory is not None:
        return None  # the user's own share, parsed once
    if CLAIM_ENV not in os.environ:
        return None
    from ..workload.runner.podclaim import decided_claim

    return decided_claim(os.environ, say)


def parse_priority(text: str, name: str = "--priority") -> int:
    """A priority given on the command line as `name`, in the pool's bounds, or a one-line InvalidInput."""
    from ..core.errors import InvalidInput
    from ..core.model import check_priority

    value: object
    try:
        value = int(text.strip())
    except ValueError:
        value = text
    return check_priority(value, InvalidInput, name)


def _idle(text: str | None) -> float | None:
    """--idle-suspend as seconds (None: the pool's rule)."""
    from ..core.model import MAX_IDLE_SUSPEND_S, MIN_IDLE_SUSPEND_S
    from ..core.quantity import parse_duration

    return None if text is None else parse_duration(text, "--idle-suspend", MIN_IDLE_SUSPEND_S, MAX_IDLE_SUSPEND_S)


def _time(text: str | None) -> float | None:
    """--time as seconds (None: no limit)."""
    from ..core.model import MAX_TIME_LIMIT_S, MIN_TIME_LIMIT_S
    from ..core.quantity import parse_duration

    return None if text is None else parse_duration(text, "--time", MIN_TIME_LIMIT_S, MAX_TIME_LIMIT_S)


def _grace(text: str | None) -> float | None:
    """--preempt-grace as seconds in [0, MAX_PREEMPT_GRACE_S] (None: the pool's default)."""
    from ..core.errors import InvalidInput
    from ..core.model import MAX_PREEMPT_GRACE_S

    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= MAX_PREEMPT_GRACE_S:  # also refuses nan and inf
        raise InvalidInput(
            f"--preempt-grace {text!r} must be a number of seconds between 0 and {MAX_PREEMPT_GRACE_S:g}, "
            "e.g. --preempt-grace 30"
        )
    return value
