"""The local executor: jobs as process groups on this machine, one detached supervisor per job.

Owns all of the local target's I/O: `executor` (LocalExecutor: submit, describe, logs, cancel),
`supervisor` (the per-job process, `python -m gpupool.jobs.executors.local.supervisor`), `state`
(the job files under the pool state dir), `processes` (replica process groups and their sweep),
`ports` (reserved TCP ports) and `dashboard` (the state dir's jobs as the web dashboard shows them).
May import: the pure part of jobs (spec, plan, environment, lifecycle, phase, rendezvous),
`executors.base`, and the floors below jobs (core, client, runner, isolation; server's dashboard
view for `dashboard`). Outside it, code uses `LocalExecutor` and `dashboard.reader` (for
`gpupool server`); tests reach the modules themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .executor import LocalExecutor


def __getattr__(name: str) -> Any:
    # Lazy, so that the supervisor (`python -m ...local.supervisor`) starts without the
    # executor's imports (PyYAML, placement) it never uses.
    if name == "LocalExecutor":
        from .executor import LocalExecutor

        return LocalExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LocalExecutor"]
