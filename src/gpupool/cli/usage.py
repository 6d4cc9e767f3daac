"""`gpupool usage`: GPU-hours (share x time) per queue, holder or label, from the pool's lease history."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from typing import TYPE_CHECKING, Dict, List, Tuple

from ..pooling.store.schema import HISTORY_REASONS
from .filters import add_filter_arguments, filter_of
from .pool_options import add_pool_arguments, pool_kwargs, print_pool

if TYPE_CHECKING:
    from ..core.queues import UsageRow

DEFAULT_SINCE = "24h"
BY_HEADERS = {"queue": "QUEUE", "holder": "HOLDER", "label": "LABEL"}
BY_LEASE = "lease"  # --by lease: the leases themselves, not a sum
HISTORY_FIELDS = (
    "lease",
    "holder",
    "label",
    "queue",
    "gpus",
    "started_at",
    "ended_at",
    "elapsed_s",
    "suspended_s",
    "gpu_seconds",
    "ended",
    "exit_code",
    "state",
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "usage",
        help="GPU-hours per queue, holder or label since a time",
        description="GPU-hours used (the share of each GPU a lease held, times how long), from ended leases "
        "and the live ones up to now. With several pools, their hours are added up per key.",
    )
    p.add_argument(
        "--since",
        default=DEFAULT_SINCE,
        metavar="WHEN",
        help=f"a duration back from now (90m, 24h, 7d, 3600 seconds) or an ISO date/time (default {DEFAULT_SINCE})",
    )
    # checked by the handler (a one-line error naming the value), not argparse's choices
    p.add_argument(
        "--by",
        default="queue",
        metavar="KEY",
        help="group by queue, holder or label (default queue); lease lists each lease that ended, as sacct does",
    )
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help='one JSON object {"since", "until", "by", "usage": [...]}')
    shown.add_argument("--csv", action="store_true", help="CSV with a header: key,gpu_hours,gpu_seconds,leases")
    add_filter_arguments(p, HISTORY_REASONS, "leases (--states: how they ended, with --by lease)")
    add_pool_arguments(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..core.queues import check_usage_key
    from ..workload.client.resolve import connect_all

    now = time.time()
    since = parse_since(args.since, now)
    keep = filter_of(args, HISTORY_REASONS)
    if args.by == BY_LEASE:
        return _history(args, since, now)
    by = check_usage_key(args.by)
    if keep.states:
        from ..core.errors import InvalidInput

        raise InvalidInput(f"--states {args.states!r} says how leases ended: give it with --by lease")
    clients = connect_all(**pool_kwargs(args))
    try:
        rows = merge([row for client in clients for row in client.usage(since, now, by, keep.user, keep.queue)])
        pools = [c.address for c in clients]
    finally:
        for c in clients:
            c.close()
    if args.json:
        print(json.dumps({"since": since, "until": now, "by": by, "usage": [r.to_dict() for r in rows]}))
    elif args.csv:
        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(["key", "gpu_hours", "gpu_seconds", "leases"])
        for r in rows:
            out.writerow([r.key, f"{r.gpu_seconds / 3600:.6f}", f"{r.gpu_seconds:.3f}", r.leases])
    else:
        from .status import _table

        print_pool(pools)
        table = [[r.key or "-", f"{r.gpu_seconds / 3600:.3f}", str(r.leases)] for r in rows]
        print(_table([BY_HEADERS[by], "GPU-HOURS", "LEASES"], table))
        total = sum(r.gpu_seconds for r in rows) / 3600
        print(f"total {total:.3f} GPU-hours since {time.strftime('%Y-%m-%d %H:%M', time.localtime(since))}")
    return 0


def _history(args: argparse.Namespace, since: float, now: float) -> int:
    """`usage --by lease`: each lease that ended since `since`, from every pool, in the order they ended."""
    from ..workload.client.resolve import connect_all

    keep = filter_of(args, HISTORY_REASONS)
    clients = connect_all(**pool_kwargs(args))
    try:
        records = sorted(
            (r for client in clients for r in client.history(since, now) if keep.keeps(r.holder, r.queue, r.reason)),
            key=lambda r: r.ended_at,
        )
        pools = [c.address for c in clients]
    finally:
        for c in clients:
            c.close()
    rows = [r.to_dict() for r in records]
    if args.json:
        print(json.dumps({"since": since, "until": now, "leases": rows}))
        return 0
    if args.csv:
        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(HISTORY_FIELDS)
        for row in rows:
            out.writerow([row[f] for f in HISTORY_FIELDS])
        return 0
    from .status import _table

    print_pool(pools)
    table = [
        [
            r["lease"],
            r["holder"] + (f" [{r['label']}]" if r["label"] else ""),
            r["queue"] or "-",
            f"{r['gpus']:g}",
            _clock(r["started_at"]),
            _clock(r["ended_at"]),
            f"{r['elapsed_s']:.0f}s",
            f"{r['suspended_s']:.0f}s",
            f"{r['gpu_seconds'] / 3600:.3f}",
            r.get("state") or r["ended"],  # preempted/suspended where a preemption stopped or parked it
            "-" if r["exit_code"] is None else str(r["exit_code"]),
        ]
        for r in rows
    ]
    print(
        _table(
            ["LEASE", "HOLDER", "QUEUE", "GPUS", "START", "END", "ELAPSED", "SUSPENDED", "GPU-HOURS", "ENDED", "EXIT"],
            table,
        )
    )
    return 0


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def merge(rows: List[UsageRow]) -> List[UsageRow]:
    """Rows of several pools added up per key, most GPU-hours first."""
    from ..core.queues import UsageRow

    totals: Dict[str, Tuple[float, int]] = {}
    for r in rows:
        seconds, leases = totals.get(r.key, (0.0, 0))
        totals[r.key] = (seconds + r.gpu_seconds, leases + r.leases)
    merged = [UsageRow(key, seconds, leases) for key, (seconds, leases) in totals.items()]
    return sorted(merged, key=lambda r: (-r.gpu_seconds, r.key))


def parse_since(text: str, now: float) -> float:
    """--since as epoch seconds: 90m, 24h, 7d, 3600 (seconds) back from `now`, or an ISO date/time
    (local time unless it names its zone); InvalidInput names the value and the forms."""
    from ..core.errors import InvalidInput

    hint = "use a duration such as 90m, 24h, 7d or 3600 (seconds), or an ISO date such as 2026-11-01T08:00"
    from ..core.quantity import duration_seconds

    seconds = duration_seconds(text)
    if seconds is not None:
        if seconds > now:
            raise InvalidInput(f"--since {text!r} reaches back before 1970: {hint}")
        return now - seconds
    from datetime import datetime

    try:
        when = datetime.fromisoformat(text.strip()).timestamp()
    except (ValueError, OverflowError, OSError):
        raise InvalidInput(f"--since {text!r} is not a time: {hint}") from None
    if when >= now:
        raise InvalidInput(f"--since {text!r} is in the future: {hint}")
    return when
