"""`gpupool queue set|list|show|delete`: the team queues of one pool, with their quotas in GPUs, and
the claims waiting in them (show)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Optional

from ..core.suspension import PREEMPT_MODES
from .filters import add_filter_arguments
from .groups import help_when_bare
from .pool_options import add_pool_arguments, connect_one, print_pool


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `queue` with its subcommands set, list and delete."""
    p = subparsers.add_parser(
        "queue",
        help="team queues: quotas in GPUs, borrowing weights, limits",
        description="Each queue is guaranteed its quota of GPUs, borrows idle GPUs beyond it in proportion to "
        "its weight (up to its limit), and gets its quota back by preempting borrowers. Changing or deleting a "
        "queue on a server needs an admin token.",
    )
    sub = p.add_subparsers(dest="queue_command", metavar="SUBCOMMAND")

    s = sub.add_parser("set", help="create or change a queue")
    s.add_argument("name", metavar="NAME", help="queue name: lowercase letters, digits and '-' (a DNS label)")
    s.add_argument("--quota", required=True, metavar="GPUS", help="GPUs guaranteed; fractions allowed (1.5)")
    s.add_argument("--weight", default="1", metavar="W", help="share of idle GPUs it may borrow (default 1)")
    s.add_argument("--limit", default=None, metavar="GPUS", help="GPUs at most, borrowing included (default none)")
    s.add_argument(
        "--preempt",
        choices=PREEMPT_MODES,
        default="",
        help="what preempting its borrowing leases does: suspend (park the GPU state, resume when there is room), "
        "requeue (stop and run again) or kill (stop); default: the pool's (gpupool server --preempt)",
    )
    s.add_argument(
        "--idle-suspend",
        default=None,
        metavar="DURATION",
        help="suspend its leases once their GPUs were 0%% busy this long (e.g. 30m; a run's own --idle-suspend "
        "wins); default: the server's",
    )
    s.add_argument(
        "--default-time",
        default=None,
        metavar="DURATION",
        help="wall-time limit of its runs without --time (e.g. 1h; as Slurm's DefaultTime); default: none "
        "(then --max-time)",
    )
    s.add_argument(
        "--max-time",
        default=None,
        metavar="DURATION",
        help="the most `gpupool run --time` may ask in it (e.g. 24h; as Slurm's MaxTime): more is refused, exit 2; "
        "default: no maximum",
    )
    add_pool_arguments(s)
    s.set_defaults(func=handle_set)

    s = sub.add_parser("list", help="queues with quota, weight, limit, allocated, borrowed, waiting")
    s.add_argument("--json", action="store_true", help='one JSON object {"queues": [...]}')
    add_pool_arguments(s)
    s.set_defaults(func=handle_list)

    s = sub.add_parser(
        "show",
        help="waiting claims in the order the pool grants them, with why each waits",
        description="Each waiting claim with its place, queue, priority, share, holder, age and why it waits "
        "(next, no room, behind a larger claim, over its queue's limit, held), in the order the pool grants "
        "them. `gpupool claim hold|release|priority CLAIM` acts on one.",
    )
    s.add_argument("queue", nargs="?", default=None, metavar="QUEUE", help="only this queue's claims")
    s.add_argument("--json", action="store_true", help='one JSON object {"waiting": [...]}')
    add_filter_arguments(s, SHOW_STATES, "waiting claims")
    add_pool_arguments(s)
    s.set_defaults(func=handle_show)

    s = sub.add_parser("delete", help="delete a queue that holds no leases and has no waiting claims")
    s.add_argument("name", metavar="NAME")
    add_pool_arguments(s)
    s.set_defaults(func=handle_delete)

    help_when_bare(p)


# What `queue show --states` keeps.
SHOW_STATES = ("waiting", "held")


def _idle(text: str) -> float:
    from ..core.model import MAX_IDLE_SUSPEND_S, MIN_IDLE_SUSPEND_S
    from ..core.quantity import parse_duration

    return parse_duration(text, "--idle-suspend", MIN_IDLE_SUSPEND_S, MAX_IDLE_SUSPEND_S)


def _time(text: Optional[str], flag: str) -> Optional[float]:
    from ..core.model import MAX_TIME_LIMIT_S, MIN_TIME_LIMIT_S
    from ..core.quantity import parse_duration

    return None if text is None else parse_duration(text, flag, MIN_TIME_LIMIT_S, MAX_TIME_LIMIT_S)


def handle_set(args: argparse.Namespace) -> int:
    from ..core.quantity import format_duration
    from ..core.queues import QueueSpec

    spec = QueueSpec.from_dict(
        {
            "name": args.name,
            "quota": gpus_flag("--quota", args.quota),
            "weight": gpus_flag("--weight", args.weight),
            "limit": None if args.limit is None else gpus_flag("--limit", args.limit),
            "preempt": args.preempt,
            "idle_suspend_s": None if args.idle_suspend is None else _idle(args.idle_suspend),
            "default_time_s": _time(args.default_time, "--default-time"),
            "max_time_s": _time(args.max_time, "--max-time"),
        }
    )
    with connect_one(args, "gpupool queue set") as client:
        status = client.set_queue(spec)
    limit = "" if status.spec.limit is None else f", limit {status.spec.limit:g}"
    preempt = f", preempt {status.spec.preempt}" if status.spec.preempt else ""
    if status.spec.idle_suspend_s is not None:
        preempt += f", idle-suspend {status.spec.idle_suspend_s:g}s"
    for flag, seconds in (("default-time", status.spec.default_time_s), ("max-time", status.spec.max_time_s)):
        if seconds is not None:
            preempt += f", {flag} {format_duration(seconds)}"
    print_pool(client, sys.stderr)
    print(
        f"queue {status.spec.name}: quota {status.spec.quota:g} GPUs, weight {status.spec.weight:g}{limit}{preempt}",
        file=sys.stderr,
    )
    return 0


def handle_list(args: argparse.Namespace) -> int:
    from .status import queue_table

    with connect_one(args, "gpupool queue list") as client:
        queues = [q.to_dict() for q in client.queues()]
    if args.json:
        print(json.dumps({"queues": queues}))
        return 0
    print_pool(client)
    if queues:
        print(queue_table(queues))
    else:
        print("no queues: every claim is first come, first served (gpupool queue set NAME --quota GPUS)")
    return 0


def handle_show(args: argparse.Namespace) -> int:
    from .claim import show_waiting

    return show_waiting(args)


def handle_delete(args: argparse.Namespace) -> int:
    with connect_one(args, "gpupool queue delete") as client:
        client.delete_queue(args.name)
    print_pool(client, sys.stderr)
    print(f"queue {args.name} deleted", file=sys.stderr)
    return 0


def gpus_flag(flag: str, text: Optional[str]) -> float:
    """A flag's finite, non-negative number; InvalidInput names the flag and the value."""
    from ..core.errors import InvalidInput

    try:
        value = float(str(text))
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise InvalidInput(f"{flag} {text!r} must be a finite number >= 0, e.g. {flag} 1.5")
    return value
