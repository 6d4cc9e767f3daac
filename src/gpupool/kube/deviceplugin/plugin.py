"""The device plugin: gRPC on a unix socket, registration with the kubelet, re-registration
when the kubelet restarts, health-driven ListAndWatch.

Allocate binds nothing: it hands the container the node agent's address and the GPUs its units
are on, and the runner in the container claims the real GPU share by pod identity when the
container starts (no Allocate-time binding, so no allocation races), on the GPUs decided for it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Sequence, Set, Tuple

import grpc

from ...core.fragmentation import LearnedMix, TaskShape
from ...core.model import Device
from ...pooling.isolation.env import ALLOCATED_GPUS_ENV, UNITS_ENV
from ..resources import UNITS, UNITS_PER_GPU
from . import api_pb2 as pb
from . import api_pb2_grpc as rpc
from .units import preferred_units, recorded_units, unit_ids

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


@dataclass
class PluginConfig:
    kubelet_dir: str = "/var/lib/kubelet/device-plugins"
    endpoint: str = "gpupool.sock"
    resource: str = UNITS
    agent_url: str = ""  # handed to containers as GPUPOOL_SERVER
    envs: Dict[str, str] = field(default_factory=dict)  # extra env for every allocation
    mounts: Sequence[Tuple[str, str, bool]] = ()  # (container path, host path, read only), if the host path exists
    watch_interval_s: float = 0.5
    # The GPUs the extender recorded (gpupool.io/choice) for each not yet started container on this
    # node asking for N units: GetPreferredAllocation gives their units rather than choosing again.
    recorded: Optional[Callable[[int], Sequence[Sequence[str]]]] = None


# The generated stubs are untyped (excluded from mypy, imported as Any): subclassing them is the gRPC idiom.
class _Service(rpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        # Wait on a condition with a timeout, so a gone kubelet or a stopping server ends the stream.
        version = -1
        while context.is_active() and not self.plugin.stopping.is_set():
            with self.plugin.changed:
                if version == self.plugin.version:
                    self.plugin.changed.wait(timeout=1.0)
                if version == self.plugin.version:
                    continue
                version = self.plugin.version
                response = self.plugin.list_response()
            yield response

    def GetPreferredAllocation(self, request: Any, context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:
        # The kubelet only counts units; the pool binds the real GPU at container start. Units
        # chosen as the pool chooses GPUs keep the kubelet's per-GPU view close to the pool's.
        responses = []
        for r in request.container_requests:
            size = int(r.allocation_size)
            ids = self.plugin.recorded_units(list(r.available_deviceIDs), list(r.must_include_deviceIDs), size)
            if ids is not None:
                responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
                continue
            self.plugin.learn(size)
            ids = preferred_units(
                list(r.available_deviceIDs),
                list(r.must_include_deviceIDs),
                size,
                self.plugin.table,
                self.plugin.mix.frag,
            )
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> pb.AllocateResponse:
        responses = []
        for creq in request.container_requests:
            unknown = [i for i in creq.devices_ids if i not in self.plugin.table]
            if unknown:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"unknown {self.plugin.config.resource} device IDs {unknown[:3]}; "
                    "the plugin restarted with other GPUs: recreate the pod",
                )
            responses.append(self.plugin.container_response(list(creq.devices_ids)))
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: grpc.ServicerContext) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class DevicePlugin:
    """Serves the DevicePlugin service and keeps it registered with the kubelet."""

    def __init__(self, devices: Sequence[Device], config: PluginConfig, mix: Optional[LearnedMix] = None) -> None:
        """Args:
        mix: the node pool's learned mix, shared (one mix per node; the pool counts the claims);
            without it the plugin learns its own from the containers' asks.
        """
        self.config = config
        self.devices = list(devices)
        self.units = unit_ids(self.devices)
        self.table = dict(self.units)
        self.mix = mix or LearnedMix()  # fragaware's mix when GetPreferredAllocation chooses
        self.learns = mix is None
        self.unhealthy: Set[str] = set()
        self.changed = threading.Condition()
        self.version = 0
        self.stopping = threading.Event()
        self.registrations = 0
        self._server: Optional[grpc.Server] = None
        self._watch: Optional[threading.Thread] = None
        self._kubelet_stamp: Optional[Tuple[int, int]] = None

    # -- state -------------------------------------------------------------
    @property
    def socket_path(self) -> str:
        return os.path.join(self.config.kubelet_dir, self.config.endpoint)

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.config.kubelet_dir, KUBELET_SOCKET)

    def set_unhealthy(self, uuids: Set[str]) -> None:
        """Mark GPUs unhealthy (from NVML XID events); ListAndWatch streams the change."""
        with self.changed:
            if set(uuids) != self.unhealthy:
                self.unhealthy = set(uuids)
                self.version += 1
                self.changed.notify_all()

    def learn(self, size: int) -> None:
        """Count a container's ask of `size` units in the plugin's own mix (a shared pool mix
        counts the claim itself, when the container's runner claims)."""
        if not self.learns:
            return
        if 0 < size <= UNITS_PER_GPU:
            self.mix.observe(TaskShape(1, size * 10))
        elif size > 0 and size % UNITS_PER_GPU == 0:
            self.mix.observe(TaskShape(size // UNITS_PER_GPU, 1000))

    def recorded_units(self, available: List[str], must: List[str], size: int) -> Optional[List[str]]:
        """The units of the GPUs the extender chose for a container of `size` units; None (logged
        when a lookup is configured) when none was recorded or the recorded GPUs cannot give them."""
        lookup = self.config.recorded
        if lookup is None:
            return None
        try:
            candidates = [tuple(g) for g in lookup(size)]
        except Exception as err:  # the API server unreachable: choose here, as without a choice
            log.warning("reading the recorded GPU choices failed (%s): choosing %d units here", err, size)
            return None
        for gpus in dict.fromkeys(candidates):  # one per distinct GPU set, in the pods' order
            ids = recorded_units(available, must, size, self.table, gpus)
            if ids is not None:
                return ids
        log.info("no recorded GPU choice holds %d units of %d available: choosing here", size, len(available))
        return None

    def list_response(self) -> pb.ListAndWatchResponse:
        return pb.ListAndWatchResponse(
            devices=[
                pb.Device(ID=uid, health=UNHEALTHY if (d.uuid in self.unhealthy or not d.healthy) else HEALTHY)
                for uid, d in self.units
            ]
        )

    def container_response(self, unit_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        """The container's env and mounts: the agent's address, its units, and the GPUs they are on
        (in GPU order), which the runner pins an unpinned claim to and checks a pinned one against."""
        envs = dict(self.config.envs)
        if self.config.agent_url:
            envs.setdefault("GPUPOOL_SERVER", self.config.agent_url)
            envs.setdefault("GPUPOOL_NODE_AGENT", self.config.agent_url)
        envs[UNITS_ENV] = str(len(unit_ids))
        gpus = sorted({self.table[u] for u in unit_ids}, key=lambda d: d.index)
        envs[ALLOCATED_GPUS_ENV] = ",".join(d.uuid for d in gpus)
        mounts = [
            pb.Mount(container_path=c, host_path=h, read_only=ro)
            for c, h, ro in self.config.mounts
            if os.path.exists(h)
        ]
        return pb.ContainerAllocateResponse(envs=envs, mounts=mounts)

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        """Serve, register, and watch for kubelet restarts (re-serving and re-registering)."""
        self._serve()
        self._register_quietly()
        self._watch = threading.Thread(target=self._watch_kubelet, name="gpupool-deviceplugin-watch", daemon=True)
        self._watch.start()

    def stop(self) -> None:
        self.stopping.set()
        with self.changed:
            self.changed.notify_all()
        if self._server is not None:
            self._server.stop(grace=1).wait()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    def _serve(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpupool-dp"))
        rpc.add_DevicePluginServicer_to_server(_Service(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        log.info("device plugin serving %d %s units on %s", len(self.units), self.config.resource, self.socket_path)

    def register(self) -> None:
        """Register with the kubelet (raises grpc.RpcError when it refuses or is absent)."""
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            rpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.config.endpoint,
                    resource_name=self.config.resource,
                    options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
                ),
                timeout=5,
            )
        self._kubelet_stamp = self._stamp(self.kubelet_socket)
        self.registrations += 1
        log.info("registered %s with the kubelet", self.config.resource)

    def _register_quietly(self) -> bool:
        try:
            self.register()
            return True
        except grpc.RpcError as err:
            details = err.details() if callable(getattr(err, "details", None)) else err
            log.warning("kubelet registration failed (will retry): %s", details)
            self._kubelet_stamp = None
            return False

    @staticmethod
    def _stamp(path: str) -> Optional[Tuple[int, int]]:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns

    def _watch_kubelet(self) -> None:
        """A restarted kubelet recreates kubelet.sock and wipes plugin sockets: serve again, register again."""
        while not self.stopping.wait(self.config.watch_interval_s):
            stamp = self._stamp(self.kubelet_socket)
            ours = os.path.exists(self.socket_path)
            if stamp is None:
                continue  # kubelet down: wait for its socket to come back
            if stamp != self._kubelet_stamp or not ours:
                if not ours:
                    self._serve()
                if not self._register_quietly():
                    time.sleep(self.config.watch_interval_s)


class HealthSource(Protocol):
    """What watch_health polls: devices.health.HealthWatcher, or the agent's wrapper of it."""

    def poll(self, timeout_ms: int) -> Set[str]: ...

    def close(self) -> None: ...


def watch_health(
    plugin: DevicePlugin, watcher_factory: Callable[[List[str]], HealthSource]
) -> Optional[threading.Thread]:
    """Feed NVML XID events into the plugin (only when there are real GPUs; emulated ones stay healthy)."""
    from ...pooling.devices.health import is_emulated

    real = [d.uuid for d in plugin.devices if not is_emulated(d.uuid)]
    if not real:
        return None

    def loop() -> None:
        try:
            watcher = watcher_factory(real)
        except Exception as err:
            log.warning("no NVML health events: %s", err)
            return
        try:
            while not plugin.stopping.is_set():
                plugin.set_unhealthy(watcher.poll(5000))
        finally:
            watcher.close()

    thread = threading.Thread(target=loop, name="gpupool-health", daemon=True)
    thread.start()
    return thread
