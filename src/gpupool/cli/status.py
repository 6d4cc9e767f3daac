"""`gpupool status`, `list-gpus`, `release`, `suspend`, `resume` LEASE_ID: look at and tidy the pool."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from ..core.suspension import LEASE_STATES, PREEMPT_MODES, PREEMPTED_AS, RESUMING, RUNNING, SUSPENDED
from .filters import add_filter_arguments, filter_of
from .pool_options import add_pool_arguments, pool_kwargs, print_pool

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

    from ..core.status import PoolStatus
    from ..workload.client.base import PoolClient

# `status --watch`: between redraws (watch(1)'s default), and its bounds.
WATCH_DEFAULT_S = 2.0
WATCH_MIN_S = 0.1
WATCH_MAX_S = 3600.0
# How long `gpupool suspend` and `resume` wait for the runner to take the step, by default.
SUSPEND_WAIT_S = 60.0
AWAIT_POLL_S = 0.1  # between looks while the runner is taking the step
# What `status --states` keeps: a lease's state, or a waiting claim's (held or not).
WAITING, HELD = "waiting", "held"
STATUS_STATES = (*LEASE_STATES, WAITING, HELD)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `status`, `list-gpus` and `release`."""
    p = subparsers.add_parser("status", help="devices, their allocation and the live leases")
    p.add_argument("--json", action="store_true", help='one JSON object {"devices": [...], "leases": [...]}')
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=WATCH_DEFAULT_S,
        default=None,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {WATCH_DEFAULT_S:g}) until Ctrl-C, as `watch` does",
    )
    add_filter_arguments(p, STATUS_STATES, "leases and waiting claims")
    add_pool_arguments(p)
    p.set_defaults(func=handle_status)

    p = subparsers.add_parser("list-gpus", help="the pool's GPUs")
    p.add_argument("--json", action="store_true", help='one JSON object {"devices": [...]}')
    add_pool_arguments(p)
    p.set_defaults(func=handle_list_gpus)

    p = subparsers.add_parser("release", help="release a lease now (yours, or any as admin)")
    p.add_argument("lease_id", metavar="LEASE_ID")
    add_pool_arguments(p)
    p.set_defaults(func=handle_release)

    p = subparsers.add_parser(
        "suspend",
        help="park a lease's GPU state in host memory and free its GPUs (yours, or any as admin)",
        description="Suspend a running lease: its runner parks the GPU state of the command's processes in "
        "their host memory and stops the rest of its tree; the lease keeps its place and frees its GPU memory. "
        "`gpupool resume LEASE_ID` brings it back.",
    )
    _lease_step_arguments(p, "the runner to park it", handle_suspend)
    p.add_argument("--reason", default="", help="why, for people (shown in status)")

    p = subparsers.add_parser(
        "resume",
        help="bring a suspended lease back when there is room (yours, or any as admin)",
        description="Resume a suspended lease: it takes room again (its GPUs, or others of the same model) as "
        "soon as there is some, ahead of later claims of its queue, and its runner restores the command.",
    )
    _lease_step_arguments(p, "it to run", handle_resume)


def _lease_step_arguments(p: argparse.ArgumentParser, awaited: str, handler: Callable[..., int]) -> None:
    """LEASE_ID, --wait and the pool flags of `suspend` and `resume`."""
    p.add_argument("lease_id", metavar="LEASE_ID")
    p.add_argument(
        "--wait",
        type=float,
        default=SUSPEND_WAIT_S,
        metavar="S",
        help=f"wait this long for {awaited} (default %(default)s)",
    )
    add_pool_arguments(p)
    p.set_defaults(func=handler)


def _status(args: argparse.Namespace) -> Tuple[PoolStatus, List[str]]:
    """The (merged) status of the pools the flags choose, and their addresses."""
    from ..workload.client.resolve import connect_all, merged_status
    from ..workload.runner import progress

    clients = connect_all(**pool_kwargs(args))
    try:
        return merged_status(clients, progress(False)), [c.address for c in clients]
    finally:
        for c in clients:
            c.close()


def handle_status(args: argparse.Namespace) -> int:
    filter_of(args, STATUS_STATES)  # a bad --states is refused before anything is asked
    if args.watch is None:
        return _show_status(args)
    from ..core.errors import InvalidInput

    if not WATCH_MIN_S <= args.watch <= WATCH_MAX_S:  # also refuses nan
        raise InvalidInput(f"--watch {args.watch:g} must be between {WATCH_MIN_S:g} and {WATCH_MAX_S:g} seconds")
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""
    try:
        while True:
            stamp = time.strftime("%H:%M:%S")
            print(f"{clear}every {args.watch:g}s: gpupool status    {stamp}" if clear else f"--- {stamp}")
            _show_status(args)
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:  # the way out of a watch: not an error
        return 0


def _show_status(args: argparse.Namespace) -> int:
    status, pools = _status(args)
    data = _filtered(status.to_dict(), args)
    if args.json:
        print(json.dumps(data))
        return 0
    print_pool(pools)
    usage = data.get("usage") or {}
    print(_device_table(data["devices"], usage))
    for problem in data.get("problems") or []:
        print(f"PROBLEM: {problem}")
    print()
    lease_used: Dict[str, int] = {}
    for proc in usage.get("processes", []):
        if proc["lease_id"]:
            lease_used[proc["lease_id"]] = lease_used.get(proc["lease_id"], 0) + proc["memory_mib"]
    if data["leases"]:
        print(lease_table(data["leases"], lease_used if usage else None))
        for lease in data["leases"]:
            error = (lease.get("suspension") or {}).get("error")
            if error:  # the last suspend or restore that failed: the runner's one line
                print(f"lease {lease['id']} ({lease.get('state', RUNNING)}): {error}")
    else:
        print("no leases")
    print(f"queued claims: {data['queued']}")
    if data.get("waiting"):
        print(waiting_table(data["waiting"]))
    if data.get("queues"):
        print()
        print(queue_table(data["queues"]))
    _print_enforcement(data.get("isolation") or {}, usage)
    return 0


def _filtered(data: Dict[str, Any], args: argparse.Namespace) -> Dict[str, Any]:
    """`status`'s data with only the leases and waiting claims --user, --queue and --states keep."""
    keep = filter_of(args, STATUS_STATES)
    if keep == type(keep)():
        return data
    leases = [
        lease
        for lease in data["leases"]
        if keep.keeps(lease["holder"]["name"], lease.get("queue") or "", lease.get("state") or RUNNING)
    ]
    waiting = [
        w
        for w in data.get("waiting") or []
        if keep.keeps(w["holder"], w["queue"] or "", HELD if w["held"] else WAITING)
    ]
    return {**data, "leases": leases, "waiting": waiting, "queued": len(waiting)}


WAITING_HEADER = ("#", "ID", "QUEUE", "PRIO", "SHARE", "HOLDER", "WAITING", "WHY")


def waiting_table(waiting: Sequence[Dict[str, Any]], now: Optional[float] = None) -> str:
    """The waiting claims (`status`, `queue show`): place ("held" for a held claim), id (what
    `gpupool claim` takes), queue, priority, share, holder, age, the reason it waits."""
    now = time.time() if now is None else now
    rows = [
        [
            "held" if w.get("held") else str(w["position"]),
            str(w["ticket"]),
            w["queue"] or "-",
            str(w["priority"]),
            w["claim"],
            w["holder"] + (f" [{w['label']}]" if w["label"] else ""),
            f"{max(now - float(w['queued_at']), 0):.0f}s",
            w["reason"] or "-",
        ]
        for w in waiting
    ]
    return _table(list(WAITING_HEADER), rows)


def _print_enforcement(isolation: Dict[str, Any], usage: Dict[str, Any]) -> None:
    """Isolation mode, processes without a lease, and the watchdog's recent actions."""
    print(f"isolation: {isolation.get('mode', 'hooks')}")
    if not usage:
        print("usage: not sampled (the embedded pool has no watchdog; a server or node agent samples)")
        return
    # Here, not at the top: the embedded pool (no watchdog, no usage) never loads the usage records.
    from ..core.usage import ProcessUsage

    age = max(time.time() - float(usage.get("sampled_at", 0)), 0)
    print(f"usage sampled {age:.0f}s ago")
    unleased = [p for p in usage.get("processes", []) if ProcessUsage.from_dict(p).unleased]
    if unleased:
        print()
        print(
            _table(
                ["UNLEASED PID", "GPU", "USED"],
                [[str(p["pid"]), p["device_uuid"], _mib(p["memory_mib"])] for p in unleased],
            )
        )
    actions = usage.get("actions") or []
    if actions:
        print()
        rows = [
            [
                time.strftime("%H:%M:%S", time.localtime(a["at"])),
                a["reason"],
                a["mode"],
                str(a["pid"]),
                a["lease_id"] or "-",
                a["holder"] or "-",
                _mib(a["memory_mib"]),
            ]
            for a in actions[-10:]
        ]
        print(_table(["AT", "REASON", "ACTION", "PID", "LEASE", "HOLDER", "USED"], rows))


def handle_list_gpus(args: argparse.Namespace) -> int:
    status, pools = _status(args)
    data = status.to_dict()
    if args.json:
        print(json.dumps({"devices": data["devices"]}))
        return 0
    print_pool(pools)
    print(_device_table(data["devices"]))
    return 0


def _on_lease(args: argparse.Namespace, act: Callable[[PoolClient], int]) -> int:
    """`act` on the pool that holds lease `args.lease_id` (it lives on one of them: ask each)."""
    from ..core.errors import NotFound, ServerUnreachable
    from ..workload.client.resolve import connect_all

    clients = connect_all(**pool_kwargs(args))
    try:
        last: Exception = NotFound(f"lease {args.lease_id!r} not found: see `gpupool status` for live leases")
        for client in clients:
            try:
                return act(client)
            except (NotFound, ServerUnreachable) as err:
                last = err
        raise last
    finally:
        for c in clients:
            c.close()


def handle_release(args: argparse.Namespace) -> int:
    def release(client: PoolClient) -> int:
        client.release(args.lease_id)
        print_pool(client, sys.stderr)
        print(f"gpupool: released lease {args.lease_id}", file=sys.stderr)
        return 0

    return _on_lease(args, release)


def handle_suspend(args: argparse.Namespace) -> int:
    def suspend(client: PoolClient) -> int:
        client.suspend(args.lease_id, args.reason)
        print_pool(client, sys.stderr)
        return _await_state(client, args.lease_id, SUSPENDED, args.wait)

    return _on_lease(args, suspend)


def handle_resume(args: argparse.Namespace) -> int:
    def resume(client: PoolClient) -> int:
        client.resume(args.lease_id)
        print_pool(client, sys.stderr)
        return _await_state(client, args.lease_id, RUNNING, args.wait)

    return _on_lease(args, resume)


def _await_state(client: PoolClient, lease_id: str, state: str, wait_s: float) -> int:
    """Say when lease `lease_id` reaches `state` (0), fails the step (1) or `wait_s` runs out (1)."""
    from ..core.errors import NotFound
    from ..core.model import RESUMING, RUNNING

    deadline = time.monotonic() + max(0.0, wait_s)
    started = time.monotonic()
    seen = ""
    while True:
        try:
            lease = client.get_lease(lease_id)
        except NotFound:
            if state == RUNNING and seen == RESUMING:  # restored, and its command has finished since
                print(f"gpupool: lease {lease_id} resumed, and its command has ended since", file=sys.stderr)
                return 0
            raise
        seen = lease.state
        error = lease.suspension.error if lease.suspension is not None else ""
        if lease.state == state:
            took = time.monotonic() - started
            print(f"gpupool: lease {lease_id} is {state} ({took:.1f} s)", file=sys.stderr)
            return 0
        if error and not lease.needs_runner:  # the step failed: the runner said why
            print(f"gpupool: lease {lease_id} is {lease.state}: {error}", file=sys.stderr)
            return 1
        if time.monotonic() >= deadline:
            print(
                f"gpupool: lease {lease_id} is {lease.state} after {wait_s:g} s "
                f"(`gpupool status` shows when it is {state})",
                file=sys.stderr,
            )
            return 1
        time.sleep(AWAIT_POLL_S)


def _device_table(devices: Sequence[Dict[str, Any]], usage: Optional[Dict[str, Any]] = None) -> str:
    """The devices of `status --json` as the table of `status` and `list-gpus`."""
    sampled = {u["uuid"]: u["memory_used_mib"] for u in (usage or {}).get("devices", [])}
    rows = []
    for d in devices:
        total, used = d["memory_mib"], d["allocated_mib"]
        pct = f" ({used * 100 // total}%)" if total else ""
        health = "" if d.get("healthy", True) else " UNHEALTHY"
        rows.append(
            [
                str(d["index"]),
                d.get("node", ""),
                d["uuid"],
                d["name"] + health,
                _mib(total),
                _mib(used) + pct,
                _mib(max(total - used, 0)),
                _mib(sampled[d["uuid"]]) if d["uuid"] in sampled else "-",
            ]
        )
    return _table(["GPU", "NODE", "UUID", "NAME", "MEMORY", "ALLOCATED", "FREE", "USED"], rows)


def lease_table(leases: Sequence[Dict[str, Any]], used: Optional[Dict[str, int]] = None, now: float = 0.0) -> str:
    """Leases as `Lease.to_dict()` writes them; `used`: sampled MiB per lease id (None: not sampled)."""
    now = now or time.time()
    rows = []
    for lease in leases:
        holder = lease["holder"]
        who = f"{holder['name'] or '?'}@{holder['host']}:{holder['pid']}" if holder["host"] else holder["name"]
        gpus = ", ".join(f"{d['uuid']}={_mib(d['memory_mib'])}" for d in lease["devices"])
        suspension = lease.get("suspension") or {}
        state = lease.get("state", RUNNING)
        # What a suspended lease parked in host memory: the GPUs it had and the bytes the node reported.
        parked = "-"
        if state in (SUSPENDED, RESUMING) and suspension:
            was = sum(int(p["memory_mib"]) for p in suspension.get("parked", ()))
            parked = f"{_gib(int(suspension.get('host_bytes', 0)))} host ({_mib(was)} GPU)"
        rows.append(
            [
                lease["id"],
                who,
                holder.get("label", ""),
                state,
                gpus or "-",
                "-" if used is None else _mib(used.get(lease["id"], 0)),
                parked,
                f"{max(lease['expires_at'] - now, 0):.0f}s",
            ]
        )
    return _table(["LEASE", "HOLDER", "LABEL", "STATE", "GPUS", "USED", "PARKED", "EXPIRES IN"], rows)


def queue_table(queues: Sequence[Dict[str, Any]]) -> str:
    """Queues as `QueueStatus.to_dict()` writes them, as the table of `status` and `queue list`."""
    rows = [
        [
            q["name"],
            gpus(q["quota"]),
            gpus(q["weight"]),
            "-" if q.get("limit") is None else gpus(q["limit"]),
            q.get("preempt_in_force") or q.get("preempt") or "-",  # the queue's mode, else the pool's
            gpus(q["allocated"]),
            gpus(q["borrowed"]),
            str(q["waiting"]),
            preempted_text(q),
        ]
        for q in queues
    ]
    header = ["QUEUE", "QUOTA", "WEIGHT", "LIMIT", "PREEMPT", "ALLOCATED", "BORROWED", "WAITING", "PREEMPTED"]
    return _table(header, rows)


def preempted_text(queue: Dict[str, Any]) -> str:
    """A queue's preemptions ever, with their modes: 3 (2 suspended, 1 requeued)."""
    by_mode = queue.get("preempted") or {}
    parts = [f"{by_mode[m]} {PREEMPTED_AS[m]}" for m in PREEMPT_MODES if by_mode.get(m)]
    total = str(queue.get("preemptions", 0))
    return f"{total} ({', '.join(parts)})" if parts else total


def gpus(value: float) -> str:
    """GPUs (or any quantity of them) to two decimals at most: 1.5, 0.33, 2."""
    return f"{round(float(value), 2):g}"


def _gib(n_bytes: int) -> str:
    """Bytes in GiB to two decimals: 2147483648 -> '2GiB', 0 -> '0GiB'."""
    return f"{round(n_bytes / 2**30, 2):g}GiB"


def _mib(mib: int) -> str:
    from ..core.quantity import format_mib

    return format_mib(int(mib))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in [list(header), *rows]]
    return "\n".join(lines)
