"""`--user`, `--queue` and `--states` of `status`, `queue show` and `usage`, as `squeue -u/-p/-t`
and `sacct -u/-s` filter theirs. (`--state` is the embedded pool's state dir on every verb, so the
states are `--states`, squeue's long name.)"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import FrozenSet, Optional, Sequence


class Filter(NamedTuple):
    """What the filter flags keep; an empty field keeps everything."""

    user: str = ""
    queue: str = ""
    states: FrozenSet[str] = frozenset()

    def keeps(self, holder: str, queue: str, state: str) -> bool:
        return (
            (not self.user or holder == self.user)
            and (not self.queue or queue == self.queue)
            and (not self.states or state in self.states)
        )


def add_filter_arguments(parser: argparse.ArgumentParser, states: Sequence[str], what: str) -> None:
    """-u/--user, --queue and --states (comma-separated, one of `states`) on `parser`."""
    group = parser.add_argument_group("filters (as squeue -u/-p/-t)")
    group.add_argument("-u", "--user", default="", metavar="NAME", help=f"only the {what} of this holder")
    group.add_argument(
        "--queue", dest="filter_queue", default="", metavar="NAME", help=f"only the {what} of this queue"
    )
    group.add_argument(
        "--states",
        default="",
        metavar="STATE[,STATE]",
        help=f"only the {what} in these states: {', '.join(states)}",
    )


def filter_of(args: argparse.Namespace, states: Sequence[str], queue: Optional[str] = None) -> Filter:
    """The Filter the flags give; InvalidInput names a state that is not one of `states`."""
    from ..core.errors import InvalidInput

    chosen = frozenset(s.strip().lower() for s in args.states.split(",") if s.strip())
    unknown = sorted(chosen - set(states))
    if unknown:
        raise InvalidInput(f"--states {unknown[0]!r} is not a state here: use one or more of {', '.join(states)}")
    return Filter(args.user, queue or args.filter_queue, chosen)
