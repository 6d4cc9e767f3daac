"""What a job does next, given how its replicas ended: a pure function of spec and exits.

Kept apart from the supervisor so the restart and success rules are tested
without processes, and so every executor that watches replicas itself (the
local one today) applies the same rules Kubernetes and Kubeflow apply.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from .plan import Replica, chief, group_restart, trainers
from .spec import JobSpec, RestartPolicy, SuccessPolicy


class Action(enum.Enum):
    CONTINUE = "continue"
    SUCCEED = "succeed"
    FAIL = "fail"
    RESTART = "restart"  # restart `Decision.replicas` (every replica for a group restart)


@dataclass(frozen=True)
class Decision:
    action: Action
    replicas: Tuple[Replica, ...] = ()
    message: str = ""


def backoff_delay(spec: JobSpec, restarts_done: int) -> float:
    """Exponential back-off before restart number `restarts_done + 1`, capped at 5 minutes."""
    return min(spec.backoff_seconds * (2.0**restarts_done), 300.0)


def decide(
    spec: JobSpec,
    reps: Tuple[Replica, ...],
    exits: Mapping[str, Optional[int]],
    restarts_done: int,
) -> Decision:
    """The next step of the job.

    Args:
        reps: every replica of the job.
        exits: exit code per replica name; None while it runs.
        restarts_done: restarts already spent against spec.backoff_limit.
    """
    failed = [r for r in reps if exits.get(r.name) not in (None, 0)]
    if failed:
        first = failed[0]
        code = int(exits[first.name] or 0)
        what = f"{first.name} exited with {code}"
        if not spec.restart_policy.should_retry(code):
            why = {
                RestartPolicy.NEVER: "restartPolicy is Never",
                RestartPolicy.EXIT_CODE: "restartPolicy ExitCode treats 1-127 as permanent",
            }.get(spec.restart_policy, "")
            return Decision(Action.FAIL, tuple(failed), f"{what} ({why})")
        if restarts_done >= spec.backoff_limit:
            return Decision(Action.FAIL, tuple(failed), f"{what}; backoffLimit {spec.backoff_limit} reached")
        targets = reps if group_restart(spec) else tuple(failed)
        scope = "the whole group" if group_restart(spec) else ", ".join(r.name for r in failed)
        return Decision(Action.RESTART, tuple(targets), f"{what}; restarting {scope}")
    lead = chief(spec, reps)
    if spec.success_policy is SuccessPolicy.CHIEF and exits.get(lead.name) == 0:
        return Decision(Action.SUCCEED, (), f"{lead.name} completed")
    if all(exits.get(r.name) == 0 for r in trainers(reps)):
        return Decision(Action.SUCCEED, (), "all workers completed")
    return Decision(Action.CONTINUE)
