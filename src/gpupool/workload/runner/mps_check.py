"""A start in `mps` isolation runs only where an MPS control daemon answers (stdlib only).

The MPS server holds a client to CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, but a CUDA program that finds no control daemon on its
CUDA_MPS_PIPE_DIRECTORY runs without MPS, silently: no memory limit, no SM limit. So right before
a command with an MPS contract starts, the daemon must answer on the contract's pipe folder; one
that does not (stopped, restarting, never started) is asked again, said once, for MPS_WAIT_S
(GPUPOOL_MPS_WAIT), and then the start fails closed with NotCapped: the command never runs.

What counts as an answer is the daemon's own: the control binary's probe command
(`isolation.mps.answers`), or, where the binary is not on PATH (a container image without the
driver's utilities), a connection to the daemon's control socket in the pipe folder, which is
where the CUDA client itself looks for it.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import NotCapped
from ...pooling.isolation.env import (
    MPS_DRIVER_LOG_DIR,
    MPS_DRIVER_PIPE_DIR,
    MPS_LOG_ENV,
    MPS_PIPE_ENV,
    MPS_WAIT_ENV,
    MPS_WAIT_S,
)
from .attest import RETRY_PAUSES_S, wait_seconds

if TYPE_CHECKING:
    from typing import Callable, Mapping, Optional

# The daemon's control socket in its pipe folder.
CONTROL_SOCKET = "control"
# One probe's limit: a daemon that takes longer is asked again while the wait lasts.
PROBE_TIMEOUT_S = 5.0


def daemon_answers(pipe_dir: str, log_dir: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the MPS control daemon answers on `pipe_dir`: the binary's probe where it is on PATH,
    else a connection to its control socket."""
    from ...pooling.isolation import mps  # only in mps isolation: other runs never load it

    if shutil.which(mps.MPS_CONTROL) is not None:
        return mps.answers(Path(pipe_dir), Path(log_dir), timeout_s=timeout_s)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(os.path.join(pipe_dir, CONTROL_SOCKET))
    except OSError:  # no socket, or a stale one nobody listens on
        return False
    finally:
        sock.close()
    return True


def require_mps_daemon(
    contract: Mapping[str, str],
    lease_id: str,
    warn: Callable[[str], None],
    environ: Optional[Mapping[str, str]] = None,
) -> str:
    """Return the pipe folder once its daemon answers; NotCapped when none did within the wait.

    `contract` is the command's MPS contract (isolation.env.mps_env); `environ` is where
    GPUPOOL_MPS_WAIT is read (the runner's environment when None).
    """
    env = os.environ if environ is None else environ
    pipe_dir = contract.get(MPS_PIPE_ENV) or MPS_DRIVER_PIPE_DIR
    log_dir = contract.get(MPS_LOG_ENV) or MPS_DRIVER_LOG_DIR
    wait_s = wait_seconds(env.get(MPS_WAIT_ENV), MPS_WAIT_ENV, MPS_WAIT_S)
    deadline = time.monotonic() + wait_s
    tries = 0
    while not daemon_answers(pipe_dir, log_dir, min(PROBE_TIMEOUT_S, max(deadline - time.monotonic(), 0.5))):
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotCapped(
                f"no MPS control daemon answered on {pipe_dir} within {wait_s:g}s, so lease {lease_id}'s command "
                "was not started (without the daemon CUDA runs it with no memory or SM limit): start the pool's "
                "daemon (`gpupool run --isolation mps` for the embedded pool; the server or node agent started "
                f"with --isolation mps restarts its own, see {log_dir}/control.log), or wait longer with "
                f"{MPS_WAIT_ENV}=SECONDS"
            )
        if tries == 0:
            warn(
                f"waiting up to {wait_s:g}s for the MPS control daemon on {pipe_dir} (lease {lease_id}); "
                "the command starts once it answers"
            )
        time.sleep(min(RETRY_PAUSES_S[min(tries, len(RETRY_PAUSES_S) - 1)], left))
        tries += 1
    return pipe_dir
