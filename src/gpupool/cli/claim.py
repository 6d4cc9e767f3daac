"""`gpupool claim hold|release|cancel|priority CLAIM_ID`: act on a waiting claim, as `scontrol hold`,
`release`, `scancel` and `update Priority=` do on a pending job; and the list `gpupool queue show` prints.

A claim's id is its ticket, the ID column of `gpupool queue show`. Its holder or an admin may
act on it; a held claim keeps its place but grants pass it over until it is released.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from ..core.errors import ClaimCancelled
from ..core.operations import CANCEL_CLAIM
from .groups import help_when_bare
from .pool_options import add_pool_arguments, connect_one, print_pool

if TYPE_CHECKING:
    from typing import Any

    from ..core.status import WaitingClaim


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `claim` with its subcommands hold, release, cancel and priority."""
    p = subparsers.add_parser(
        "claim",
        help="hold, release, cancel or reprioritise a waiting claim (yours, or any as admin)",
        description="Act on a claim waiting in the pool's queue (its ID: `gpupool queue show`). A held claim "
        "keeps its place but is passed over by grants until released; its priority orders it within its queue.",
    )
    sub = p.add_subparsers(dest="claim_command", metavar="SUBCOMMAND")
    for name, help_line, handler in (
        ("hold", "keep a waiting claim in the queue but let no grant take it", handle_hold),
        ("release", "let grants take a held claim again, in its place", handle_release),
        (
            "cancel",
            f"take a waiting claim out of the queue: its `gpupool run` exits {ClaimCancelled.exit_code} unrun",
            handle_cancel,
        ),
    ):
        s = sub.add_parser(name, help=help_line)
        s.add_argument("claim_id", metavar="CLAIM_ID", help="the claim's id (ID of `gpupool queue show`)")
        add_pool_arguments(s)
        s.set_defaults(func=handler)
    s = sub.add_parser("priority", help="change a waiting claim's priority: higher goes first within its queue")
    s.add_argument("claim_id", metavar="CLAIM_ID", help="the claim's id (ID of `gpupool queue show`)")
    s.add_argument("priority", metavar="N", help="a whole number; higher first (e.g. 10)")
    add_pool_arguments(s)
    s.set_defaults(func=handle_priority)

    help_when_bare(p)


def handle_hold(args: argparse.Namespace) -> int:
    with connect_one(args, "gpupool claim hold") as client:
        claim = client.hold_claim(args.claim_id)
    return _said(client, claim, "held: grants pass it over until `gpupool claim release`")


def handle_release(args: argparse.Namespace) -> int:
    with connect_one(args, "gpupool claim release") as client:
        claim = client.release_claim(args.claim_id)
    return _said(client, claim, f"released: it waits at position {claim.position}")


def handle_cancel(args: argparse.Namespace) -> int:
    with connect_one(args, "gpupool claim cancel") as client:
        claim = client.call(CANCEL_CLAIM, claim_id=args.claim_id)  # a verb of the table without a method of its own
    return _said(client, claim, "cancelled: it left the queue, and its waiting run exits without running its command")


def handle_priority(args: argparse.Namespace) -> int:
    from .run import parse_priority

    priority = parse_priority(args.priority, "priority")
    with connect_one(args, "gpupool claim priority") as client:
        claim = client.set_claim_priority(args.claim_id, priority)
    place = "it is held" if claim.held else f"it waits at position {claim.position}"
    return _said(client, claim, f"priority {claim.priority}: {place}")


def _said(client: Any, claim: WaitingClaim, what: str) -> int:
    print_pool(client, sys.stderr)
    print(f"gpupool: claim {claim.ticket} ({claim.claim}, {claim.holder}) {what}", file=sys.stderr)
    return 0


def show_waiting(args: argparse.Namespace) -> int:
    """`gpupool queue show [QUEUE]`: the waiting claims in the order the pool grants them."""
    from .filters import filter_of
    from .queue import SHOW_STATES

    keep = filter_of(args, SHOW_STATES, args.queue)
    with connect_one(args, "gpupool queue show") as client:
        listed = client.waiting(keep.queue or None)
    waiting = [w.to_dict() for w in listed if keep.keeps(w.holder, w.queue or "", "held" if w.held else "waiting")]
    if args.json:
        print(json.dumps({"waiting": waiting}))
        return 0
    print_pool(client)
    if waiting:
        from .status import waiting_table

        print(waiting_table(waiting))
    else:
        print("no claims waiting" + (f" in queue {keep.queue}" if keep.queue else ""))
    return 0
