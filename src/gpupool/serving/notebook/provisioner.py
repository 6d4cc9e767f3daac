"""`GpupoolProvisioner`: the jupyter_client face of a kernel that runs under a gpupool lease.

A LocalProvisioner whose process is `gpupool run` (the runner: env, hook, tree ownership,
release on every exit path; each start, restarts too, is a new lease) with the wrapped kernel
on sockets of its own, a proxy between those and the ports the frontend knows, and a gate that
suspends the lease while the kernel idles. The runner gets SIGTERM when the Jupyter process
dies (PR_SET_PDEATHSIG), so it ends the kernel and releases. Signals other than SIGTERM go to
the kernel's own process group: an interrupt reaches the kernel, never the runner.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets import Float, Integer, Unicode

from .launch import KernelSettings, internal_connection, kernel_pid, remove_sockets, runner_command

if TYPE_CHECKING:
    from typing import Any, Dict, Optional

    from jupyter_client.connect import KernelConnectionInfo

    from .gate import KernelGate
    from .proxy import KernelProxy

# After the kernel is killed, the runner releases its lease and exits; past this it is killed too.
RUNNER_EXIT_S = 10.0


class GpupoolProvisioner(LocalProvisioner):
    """Starts the kernel under a lease of the kernelspec's share; see the module's docstring."""

    kernel_name = Unicode("", config=True, help="the kernelspec's name (the lease's label: kernel:NAME:ID)")
    fraction = Float(None, allow_none=True, config=True, help="share of one GPU's memory")
    memory_mib = Integer(None, allow_none=True, config=True, help="GPU memory in MiB (instead of a fraction)")
    queue = Unicode("", config=True, help="the team queue to claim in")
    idle_suspend_s = Float(600.0, allow_none=True, config=True, help="suspend after this long idle (None: never)")
    server = Unicode("", config=True, help="pool server URL (default: as gpupool run finds it)")

    _proxy: Optional[KernelProxy] = None
    _gate: Optional[KernelGate] = None
    _internal: Optional[Path] = None
    _backend: Optional[Dict[str, Any]] = None  # the kernel's own connection

    @property
    def settings(self) -> KernelSettings:
        return KernelSettings(
            self.kernel_name or "gpupool",
            self.fraction,
            self.memory_mib,
            self.queue,
            self.idle_suspend_s,
            self.server,
        )

    @property
    def label(self) -> str:
        return f"kernel:{self.settings.name}:{self.kernel_id}"

    async def pre_launch(self, **kwargs: Any) -> Dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        frontend_file = str(getattr(self.parent, "connection_file", "") or "")
        base = (
            Path(frontend_file)
            if frontend_file
            else Path(os.environ.get("TMPDIR", "/tmp")) / f"kernel-{self.kernel_id}.json"
        )
        self._internal = base.with_name(base.stem + "-gpupool.json")
        self._backend = internal_connection(self.connection_info, self._internal)
        label = self.label
        notebook = kwargs.get("env", {}).get("JPY_SESSION_NAME", "")
        if notebook:  # the frontend's notebook path: shown beside the label in status
            label = f"{label} {notebook}"
        kwargs["cmd"] = runner_command(self.settings, label, kwargs["cmd"], frontend_file, self._internal)
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        from ...workload.runner.prctl import parent_death_signal

        self._start_proxy()
        kwargs.setdefault("preexec_fn", parent_death_signal(signal.SIGTERM))
        try:
            return await super().launch_kernel(cmd, **kwargs)
        except BaseException:
            self._stop_proxy()
            raise

    def _start_proxy(self) -> None:
        from jupyter_client.session import Session

        from ...workload.client.resolve import connect_all
        from .gate import KernelGate
        from .proxy import KernelProxy

        backend = self._backend
        assert backend is not None
        info = self.connection_info
        key = info.get("key", b"")
        session = Session(
            key=key if isinstance(key, bytes) else str(key).encode(),
            signature_scheme=str(info.get("signature_scheme", "hmac-sha256")),
            username="gpupool",
        )
        clients = connect_all([self.server] if self.server else None)

        def say(text: str, parent: Optional[Dict[str, Any]]) -> None:
            msg = session.msg("stream", {"name": "stderr", "text": text}, parent=parent or {})
            proxy.publish(session.serialize(msg, ident=b"stream.stderr"))

        gate = KernelGate(clients, self.label, self.idle_suspend_s, say, lambda: proxy.release())
        proxy = KernelProxy(info, backend, gate)
        self._gate, self._proxy = gate, proxy
        proxy.start()
        gate.start()

    def _stop_proxy(self) -> None:
        if self._gate is not None:
            self._gate.stop()
            for client in self._gate.clients:
                try:
                    client.close()
                except Exception:  # closing must not hide the shutdown
                    self.log.debug("closing a pool client failed", exc_info=True)
            self._gate = None
        if self._proxy is not None:
            self._proxy.stop()
            self._proxy = None

    def _kernel_pid(self) -> Optional[int]:
        if self.pid is None or self._internal is None:
            return None
        return kernel_pid(self.pid, self._internal)

    async def send_signal(self, signum: int) -> None:
        """SIGTERM to the runner (it ends the kernel and releases); any other signal to the kernel's
        process group (SIGINT interrupts the kernel; the runner would count it as a stop)."""
        pid = None if signum == signal.SIGTERM else self._kernel_pid()
        if pid is None:
            await super().send_signal(signum)
            return
        try:
            os.killpg(pid, signum)
        except OSError:
            os.kill(pid, signum)

    async def kill(self, restart: bool = False) -> None:
        """SIGKILL the kernel (parked or not); the runner then releases and exits, or is killed."""
        if self.process is None:
            return
        pid = self._kernel_pid()
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            for _ in range(int(RUNNER_EXIT_S / 0.1)):
                if self.process is None or self.process.poll() is not None:
                    return
                await asyncio.sleep(0.1)
        await super().kill(restart)

    async def terminate(self, restart: bool = False) -> None:
        """SIGTERM to the runner, and SIGCONT to a kernel stopped while its lease is parked, so the
        forwarded SIGTERM acts now."""
        await super().terminate(restart)
        pid = self._kernel_pid()
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGCONT)
            except OSError:
                pass

    async def cleanup(self, restart: bool = False) -> None:
        self._stop_proxy()
        if self._internal is not None:
            self._internal.unlink(missing_ok=True)
            self._internal = None
        if self._backend is not None:
            remove_sockets(self._backend)
            self._backend = None
        await super().cleanup(restart)
