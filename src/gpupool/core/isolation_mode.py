"""How a node holds its leases' limits: the isolation mode, and where its MPS daemon lives.

Its own module, apart from the usage records in core.usage: every `gpupool run` needs the mode
(it sets the command's environment), none needs the usage records.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, NamedTuple

from .errors import InvalidInput

if TYPE_CHECKING:
    from typing import Any, Dict, Mapping, Optional

# The MPS daemon's folder below the state dir (its pipe and log folders): other users' processes
# reach its pipes, so the state dir's privacy (store.private) leaves it to its own modes.
MPS_DIR = "mps"


class IsolationMode(enum.Enum):
    """How a lease's limits are held on a node."""

    MPS = "mps"  # CUDA MPS: the driver caps memory and SM share per client
    HOOKS = "hooks"  # env + import hook: PyTorch/TensorFlow/JAX cap themselves
    NONE = "none"  # CUDA_VISIBLE_DEVICES only

    @classmethod
    def parse(cls, text: str) -> IsolationMode:
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            raise InvalidInput(f"isolation {text!r} is unknown: use mps, hooks or none") from None


class NodeIsolation(NamedTuple):
    """A node's isolation mode, and in `mps` mode the folders of its MPS control daemon."""

    mode: IsolationMode = IsolationMode.HOOKS
    mps_pipe_dir: str = ""
    mps_log_dir: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return {"mode": self.mode.value, "mps_pipe_dir": self.mps_pipe_dir, "mps_log_dir": self.mps_log_dir}

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]]) -> NodeIsolation:
        data = data or {}
        return cls(
            IsolationMode.parse(data.get("mode", IsolationMode.HOOKS.value)),
            str(data.get("mps_pipe_dir", "") or ""),
            str(data.get("mps_log_dir", "") or ""),
        )
