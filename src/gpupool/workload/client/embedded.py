"""The embedded pool client: the Pool service of gpupool.pooling.pool, in-process, on a state dir.

No server needed: several `gpupool run` processes on one machine share the
pool through the SQLite store in the state dir.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.isolation_mode import IsolationMode, NodeIsolation
from ...core.model import Device, local_user
from ...core.operations import Operation, invoke
from ...logs import get_logger
from .base import PoolClient

if TYPE_CHECKING:  # types only: the workload path never needs the queue classes
    from typing import Any, Optional, Sequence, TypeVar

    A = TypeVar("A")

log = get_logger(__name__)

STATE_ENV = "GPUPOOL_STATE"


def default_state_dir() -> Path:
    """`$GPUPOOL_STATE`, else `$XDG_STATE_HOME/gpupool`, else `~/.local/state/gpupool`."""
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "gpupool"


class EmbeddedPoolClient(PoolClient):
    """Calls `gpupool.pooling.pool.Pool` directly; the local user is the admin of their own state dir."""

    def __init__(
        self,
        state_dir: Optional[Path] = None,
        devices: Optional[Sequence[Device]] = None,
        node: str = "",
        isolation: Optional[IsolationMode] = None,
        devices_from_env: bool = False,
    ) -> None:
        from ...pooling.pool import Pool  # imported here: the pool is only needed without a server

        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.address = f"embedded:{self.state_dir}"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._pool = Pool.open(
            self.state_dir,
            devices=list(devices) if devices is not None else None,
            node=node,
            devices_from_env=devices_from_env,
        )
        try:
            if isolation is IsolationMode.MPS:
                from ...pooling.isolation.mps import ensure_detached

                # No process of the embedded pool lives long: its MPS daemon stays as pool infrastructure.
                self._pool.set_isolation(ensure_detached(self.state_dir))
            elif isolation is not None:
                self._pool.set_isolation(NodeIsolation(isolation))
        except BaseException:
            self._pool.close()
            raise

    def call(self, op: Operation[A], **args: Any) -> A:
        # The pool answers every operation itself. As the admin of the state dir (requester None),
        # in the name of the local user: its own leases' owner in the history. Expired leases are
        # left out of its answers and reclaimed on the next write: no reaper without a server.
        return invoke(self._pool, op, args, None, local_user())

    def close(self) -> None:
        self._pool.close()
