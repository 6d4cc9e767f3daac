"""`gpupool status`, `gpupool list-gpus`, `gpupool release LEASE_ID`: look at and tidy the pool."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from .pool_options import add_pool_arguments, pool_kwargs

if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Sequence

    from ..core.status import PoolStatus


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `status`, `list-gpus` and `release`."""
    p = subparsers.add_parser("status", help="devices, their allocation and the live leases")
    p.add_argument("--json", action="store_true", help='one JSON object {"devices": [...], "leases": [...]}')
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


def _status(args: argparse.Namespace) -> PoolStatus:
    from ..client.resolve import connect_all, merged_status
    from ..runner import progress

    clients = connect_all(**pool_kwargs(args))
    try:
        return merged_status(clients, progress(False))
    finally:
        for c in clients:
            c.close()


def handle_status(args: argparse.Namespace) -> int:
    status = _status(args)
    if args.json:
        print(json.dumps(status.to_dict()))
        return 0
    data = status.to_dict()
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
        now = time.time()
        rows = []
        for lease in data["leases"]:
            holder = lease["holder"]
            who = f"{holder['name'] or '?'}@{holder['host']}:{holder['pid']}" if holder["host"] else holder["name"]
            gpus = ", ".join(f"{d['uuid']}={_mib(d['memory_mib'])}" for d in lease["devices"])
            used = _mib(lease_used.get(lease["id"], 0)) if usage else "-"
            rows.append(
                [lease["id"], who, holder.get("label", ""), gpus, used, f"{max(lease['expires_at'] - now, 0):.0f}s"]
            )
        print(_table(["LEASE", "HOLDER", "LABEL", "GPUS", "USED", "EXPIRES IN"], rows))
    else:
        print("no leases")
    print(f"queued claims: {data['queued']}")
    if data.get("queues"):
        print()
        print(queue_table(data["queues"]))
    _print_enforcement(data.get("isolation") or {}, usage)
    return 0


def _print_enforcement(isolation: Dict[str, Any], usage: Dict[str, Any]) -> None:
    """Isolation mode, processes without a lease, and the watchdog's recent actions."""
    print(f"isolation: {isolation.get('mode', 'hooks')}")
    if not usage:
        print("usage: not sampled (the embedded pool has no watchdog; a server or node agent samples)")
        return
    age = max(time.time() - float(usage.get("sampled_at", 0)), 0)
    print(f"usage sampled {age:.0f}s ago")
    unleased = [p for p in usage.get("processes", []) if not p["lease_id"]]
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
    data = _status(args).to_dict()
    if args.json:
        print(json.dumps({"devices": data["devices"]}))
        return 0
    print(_device_table(data["devices"]))
    return 0


def handle_release(args: argparse.Namespace) -> int:
    from ..client.resolve import connect_all
    from ..core.errors import NotFound, ServerUnreachable

    clients = connect_all(**pool_kwargs(args))
    try:
        last: Exception = NotFound(f"lease {args.lease_id!r} not found: see `gpupool status` for live leases")
        for client in clients:  # the lease lives on one of them; ask each
            try:
                client.release(args.lease_id)
            except (NotFound, ServerUnreachable) as err:
                last = err
                continue
            print(f"gpupool: released lease {args.lease_id} on {client.address}", file=sys.stderr)
            return 0
        raise last
    finally:
        for c in clients:
            c.close()


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


def queue_table(queues: Sequence[Dict[str, Any]]) -> str:
    """Queues as `QueueStatus.to_dict()` writes them, as the table of `status` and `queue list`."""
    rows = [
        [
            q["name"],
            gpus(q["quota"]),
            gpus(q["weight"]),
            "-" if q.get("limit") is None else gpus(q["limit"]),
            gpus(q["allocated"]),
            gpus(q["borrowed"]),
            str(q["waiting"]),
            str(q.get("preemptions", 0)),
        ]
        for q in queues
    ]
    return _table(["QUEUE", "QUOTA", "WEIGHT", "LIMIT", "ALLOCATED", "BORROWED", "WAITING", "PREEMPTED"], rows)


def gpus(value: float) -> str:
    """GPUs (or any quantity of them) to two decimals at most: 1.5, 0.33, 2."""
    return f"{round(float(value), 2):g}"


def _mib(mib: int) -> str:
    from ..core.quantity import format_mib

    return format_mib(int(mib))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in [list(header), *rows]]
    return "\n".join(lines)
