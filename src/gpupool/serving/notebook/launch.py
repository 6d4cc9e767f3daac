"""How a kernel starts under a lease: `python -m gpupool run ... -- KERNEL ARGV` on sockets of its own.

The frontend keeps the ports jupyter_client chose (the proxy binds them); the kernel gets an
internal connection file with sockets of its own and the same key, so every message it signs is valid
on both sides and the proxy never re-signs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Sequence

CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
SOCKETS_PREFIX = "gpupool-kernel-"  # the kernel's sockets: TMPDIR/gpupool-kernel-XXXXXXXX/k-1 .. k-5
# A Unix socket's path holds at most 107 bytes: a longer TMPDIR gives way to /tmp.
SOCKET_PATH_MAX = 107
# How long a starting kernel queues for its share (the frontend shows it as connecting).
CLAIM_WAIT_S = 3600


@dataclass(frozen=True)
class KernelSettings:
    """A kernelspec's gpupool settings (its provisioner config)."""

    name: str
    fraction: Optional[float] = None
    memory_mib: Optional[int] = None
    queue: str = ""
    idle_suspend_s: Optional[float] = 600.0
    server: str = ""

    def to_config(self) -> Dict[str, Any]:
        return {
            "kernel_name": self.name,
            "fraction": self.fraction,
            "memory_mib": self.memory_mib,
            "queue": self.queue,
            "idle_suspend_s": self.idle_suspend_s,
            "server": self.server,
        }

    def share(self) -> str:
        return f"{self.memory_mib} MiB GPU" if self.memory_mib is not None else f"{self.fraction or 1.0:g} GPU"

    def idle(self) -> str:
        """The idle limit as written: 10m, 3s, never."""
        from ...core.quantity import format_duration

        return "never" if self.idle_suspend_s is None else format_duration(self.idle_suspend_s)

    def describe(self) -> str:
        return f"{self.share()}, queue {self.queue or 'default'}, idle suspend {self.idle()}" + (
            f", server {self.server}" if self.server else ""
        )

    def label(self) -> str:
        """What tells this kernel from another in a frontend's list: share, idle limit, queue and server if set."""
        parts = [self.share(), f"idle {self.idle()}"]
        if self.queue:
            parts.append(f"queue {self.queue}")
        if self.server:
            parts.append(self.server)
        return ", ".join(parts)


def internal_connection(frontend: Mapping[str, Any], path: Path) -> Dict[str, Any]:
    """Write the kernel's own connection file beside the frontend's (mode 0600: it holds the key).

    The kernel listens on Unix sockets (ZeroMQ's ipc transport) in a folder of its own, mode
    0700, not on TCP ports: a free port picked now could be taken by another process before the
    kernel binds it (the kernel starts only once its claim is granted), and only this user can
    reach a socket there. Abstract sockets (`@name`) would leave no file behind, but every local
    user can list (/proc/net/unix) and reach them: one could then replay the kernel's own signed
    output to it, which it accepts, and keep it busy without the proxy seeing. `remove_sockets`
    removes the folder."""
    base = tempfile.gettempdir()
    if len(base) + len(SOCKETS_PREFIX) + 16 > SOCKET_PATH_MAX:
        base = "/tmp"
    folder = tempfile.mkdtemp(prefix=SOCKETS_PREFIX, dir=base)  # mode 0700, a new name
    info: Dict[str, Any] = {f"{channel}_port": n for n, channel in enumerate(CHANNELS, 1)}
    info.update(
        ip=os.path.join(folder, "k"),  # the sockets are FOLDER/k-1 .. k-5
        transport="ipc",
        key=_text(frontend.get("key", b"")),
        signature_scheme=frontend.get("signature_scheme", "hmac-sha256"),
        kernel_name=frontend.get("kernel_name", ""),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(info, out)
    return info


def remove_sockets(info: Mapping[str, Any]) -> None:
    """Remove the folder of the kernel's sockets that `internal_connection` made."""
    folder = os.path.dirname(str(info.get("ip", "")))
    if os.path.basename(folder).startswith(SOCKETS_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def runner_command(
    settings: KernelSettings, label: str, argv: Sequence[str], frontend_file: str, internal: Path
) -> List[str]:
    """The runner's argv: the kernel's argv with the internal connection file in place of the frontend's."""
    wrapped = [a.replace(frontend_file, str(internal)) if frontend_file else a for a in argv]
    command = [sys.executable, "-m", "gpupool", "run", "-q", "-n", "1", "--wait", str(CLAIM_WAIT_S)]
    if settings.memory_mib is not None:
        command += ["-m", str(settings.memory_mib)]
    else:
        command += ["-p", f"{settings.fraction or 1.0:g}"]
    command += ["--label", label]
    if settings.queue:
        command += ["--queue", settings.queue]
    if settings.server:
        command += ["--server", settings.server]
    return [*command, "--", *wrapped]


def kernel_pid(runner_pid: int, internal: Path) -> Optional[int]:
    """The kernel process under runner `runner_pid`: the descendant whose argv names `internal`."""
    from ...pooling.isolation.proctree import descendants

    marker = str(internal).encode()
    for pid in descendants(runner_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = handle.read()
        except OSError:
            continue
        if marker in argv and b"gpupool\0run\0" not in argv:  # not the runner's guard (a fork of it)
            return pid
    return None
