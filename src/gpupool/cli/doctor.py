"""`gpupool doctor`, `gpupool backup`, `gpupool restore`: check a pool, copy its database, bring one back."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List

from .pool_options import add_pool_arguments, pool_kwargs, print_pool

EXAMPLES = """its verdict: exit 0 healthy, 1 a broken invariant (each one named), 7 the database is damaged.

examples:
  gpupool doctor --state /var/lib/gpupool
  gpupool doctor --server https://gpu1:56001     # the server checks its own state (admin token)
  gpupool backup --state /var/lib/gpupool /backups/pool-$(date +%F).db
  gpupool restore --state /var/lib/gpupool /backups/pool-2026-11-22.db   # with the server stopped
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `doctor`, `backup` and `restore`."""
    p = subparsers.add_parser(
        "doctor",
        help="check a pool's invariants and its database",
        description="Check the pool: allocated <= total per GPU, allocated = the sum of the leases, no lease "
        "on an unknown GPU, queue tickets well formed, and SQLite's integrity_check. Prints a verdict.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="the report as one JSON object")
    # The pool as every client verb finds it (--server, --state, $GPUPOOL_SERVER, client.yaml, the
    # embedded default); a server checks its own state (an admin token).
    add_pool_arguments(p)
    p.set_defaults(func=handle_doctor)

    p = subparsers.add_parser(
        "backup",
        help="copy a pool's database with SQLite's online backup",
        description="Copy STATE/pool.db to FILE, consistently, even while a server or clients use it.",
    )
    p.add_argument("--state", metavar="DIR", help="state dir (default: $GPUPOOL_STATE or ~/.local/state/gpupool)")
    p.add_argument("file", metavar="FILE", help="the backup to write (must not exist)")
    p.set_defaults(func=handle_backup)

    p = subparsers.add_parser(
        "restore",
        help="replace a pool's database with a backup",
        description="Check FILE, move STATE/pool.db aside (pool.db.before-restore-TIME) and copy FILE in its "
        "place. Stop the server and running `gpupool run`s of this state dir first.",
    )
    p.add_argument("--state", metavar="DIR", help="state dir (default: $GPUPOOL_STATE or ~/.local/state/gpupool)")
    p.add_argument("file", metavar="FILE", help="a file written by `gpupool backup`")
    p.set_defaults(func=handle_restore)


def _state(args: argparse.Namespace) -> Path:
    from ..workload.client.embedded import default_state_dir

    return Path(args.state).expanduser() if args.state else default_state_dir()


def handle_doctor(args: argparse.Namespace) -> int:
    from ..core.errors import InvalidInput
    from ..workload.client.resolve import EMBEDDED, choose_pools

    kwargs = pool_kwargs(args)
    choices = choose_pools(kwargs["servers"], kwargs["state_dir"], kwargs["token_file"], kwargs["ca_file"])
    if len(choices) > 1:
        raise InvalidInput(
            f"gpupool doctor checks one pool, and {len(choices)} are configured "
            f"({', '.join(c.address for c in choices)}): pick one with --server URL or --state DIR"
        )
    choice = choices[0]
    if choice.address.lower().startswith(EMBEDDED):
        from ..pooling.pool.doctor import check_state

        state = _existing_pool(Path(choice.address[len(EMBEDDED) :]))
        pool, report = f"embedded:{state}", check_state(state).to_dict()
    else:
        from ..core.operations import DOCTOR
        from ..workload.client.http import HttpPoolClient

        client = HttpPoolClient(choice.address, token=choice.token, ca=choice.ca)
        try:
            pool, report = client.address, client.call(DOCTOR)
        finally:
            client.close()
    if args.json:
        print(json.dumps(report))
    else:
        print_pool(pool)
        print(report["verdict"])
        for problem in report["problems"]:
            print(f"  {problem['kind']}: {problem['message']}")
    if report["healthy"]:
        return 0
    return 7 if any(p["kind"] == "integrity" for p in report["problems"]) else 1


def _existing_pool(state: Path) -> Path:
    """`state` when a pool lives (or lived) there; NotFound for a folder that never held one (a typo),
    which is not a damaged database."""
    from ..core.errors import NotFound
    from ..pooling.store import DB_NAME
    from ..pooling.store.marker import MARKER_NAME

    if not (state / DB_NAME).exists() and not (state / MARKER_NAME).exists():
        raise NotFound(f"{state} holds no pool (no {DB_NAME}): check --state, or start one there with `gpupool server`")
    return state


def handle_backup(args: argparse.Namespace) -> int:
    from ..pooling.store.maintenance import backup

    target = backup(_state(args), args.file)
    print_pool(f"embedded:{_state(args)}", sys.stderr)
    print(f"gpupool: backed up {_state(args)} to {target}", file=sys.stderr)
    return 0


def handle_restore(args: argparse.Namespace) -> int:
    from ..pooling.store.maintenance import restore

    aside = restore(_state(args), args.file)
    print_pool(f"embedded:{_state(args)}", sys.stderr)
    print(f"gpupool: restored {_state(args)} from {args.file}; the previous database is {aside}", file=sys.stderr)
    return 0


__all__: List[str] = ["register"]
