"""The DRA plugin of the node agent: the kubelet's DRAPlugin gRPC service and its registration on
Unix sockets, the node's ResourceSlice, and the renewal of prepared claims' leases.

A claim that cannot be prepared gets its error in its own response entry; the call itself only
fails for a request the kubelet could not have meant (no claims is an empty answer, not an error).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

import grpc

from ...core.errors import InvalidInput
from ...pooling.isolation.hookdir import write_hook_dir
from ...pooling.pool import Pool
from ...serving.enforcement.attest import node_attestations
from ..apiclient import ApiError, KubeApi
from . import DEFAULT_DRIVER
from . import dra_pb2 as pb
from . import dra_pb2_grpc as rpc
from . import pluginregistration_pb2_grpc as reg_rpc
from .attributes import nvml_attributes
from .cdi import DEFAULT_CDI_DIR
from .prepare import RENEW_EVERY_S, ClaimRef, PrepareError, Preparer
from .prepared_claims import PreparedDevice, PreparedStore
from .registration import RegistrationService, kubelet_root, registration_socket, service_socket
from .slices import SlicePublisher

log = logging.getLogger(__name__)

MAX_SOCKET_PATH = 107  # sun_path less its terminating NUL
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass
class DraConfig:
    kubelet_dir: str = "/var/lib/kubelet/device-plugins"  # the agent's; DRA sockets go in its kubelet root
    driver: str = DEFAULT_DRIVER
    cdi_dir: str = DEFAULT_CDI_DIR
    state_dir: str = "/var/lib/gpupool"  # prepared claims and hook folder (DRA/ below it)
    node: str = ""
    renew_every_s: float = RENEW_EVERY_S
    slice_every_s: float = 5.0  # how often device health is compared with the published slice

    def check(self) -> None:
        """A driver name Kubernetes accepts (a DNS subdomain of at most 63 characters), or one line why not."""
        if len(self.driver) > 63 or not _DNS_SUBDOMAIN.match(self.driver):
            raise InvalidInput(
                f"--driver {self.driver!r} is not a DNS subdomain of at most 63 characters: use e.g. {DEFAULT_DRIVER}"
            )


# The generated stubs are untyped (excluded from mypy, imported as Any): subclassing them is the gRPC idiom.
class DraService(rpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> pb.NodePrepareResourcesResponse:
        answer = pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.uid, claim.name)
            entry = answer.claims[claim.uid]
            try:
                entry.devices.extend(_device(d) for d in self.preparer.prepare(ref))
            except PrepareError as err:
                entry.error = str(err)
            except Exception as err:  # never a crash: the kubelet retries this claim
                log.exception("preparing claim %s failed", ref)
                entry.error = f"claim {ref}: internal error: {err}"
        return answer

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> pb.NodeUnprepareResourcesResponse:
        answer = pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.uid, claim.name)
            entry = answer.claims[claim.uid]
            try:
                self.preparer.unprepare(ref)
            except Exception as err:
                log.exception("unpreparing claim %s failed", ref)
                entry.error = f"claim {ref}: {err}"
        return answer


def _device(d: PreparedDevice) -> pb.Device:
    return pb.Device(
        request_names=list(d.request_names),
        pool_name=d.pool_name,
        device_name=d.device_name,
        cdi_device_ids=list(d.cdi_device_ids),
    )


class DraPlugin:
    """Serves DRA for the node's pool: start() binds both sockets and publishes the slice; stop() ends it all."""

    def __init__(self, pool: Pool, api: KubeApi, config: DraConfig) -> None:
        config.check()
        self.pool, self.api, self.config = pool, api, config
        root = kubelet_root(config.kubelet_dir)
        self.registration_socket = registration_socket(root, config.driver)
        self.service_socket = service_socket(root, config.driver)
        state = Path(config.state_dir) / "dra"
        self.prepared = PreparedStore(state / "checkpoint.json")  # the name older releases wrote
        self.hook_dir = str(write_hook_dir(state / "hook"))
        self.preparer = Preparer(
            pool,
            api,
            self.prepared,
            config.driver,
            config.node,
            config.cdi_dir,
            self.hook_dir,
            node_attestations(pool.state_dir),  # the pods of each claim, for the agent's watchdog
        )
        self.registration = RegistrationService(config.driver, self.service_socket)
        self.slices = SlicePublisher(api, config.driver, config.node, nvml_attributes(pool.devices()))
        self.stopping = threading.Event()
        self._servers: List[grpc.Server] = []
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Serve DRA, then register: the registration socket appears last, when the service answers."""
        service = self._server("gpupool-dra")
        rpc.add_DRAPluginServicer_to_server(DraService(self.preparer), service)
        self._bind(service, self.service_socket)
        registrar = self._server("gpupool-dra-reg")
        reg_rpc.add_RegistrationServicer_to_server(self.registration, registrar)
        self._bind(registrar, self.registration_socket)
        self.publish_slice()
        self._thread = threading.Thread(target=self._loop, name="gpupool-dra", daemon=True)
        self._thread.start()
        log.info(
            "DRA driver %s serving on %s (registration %s)",
            self.config.driver,
            self.service_socket,
            self.registration_socket,
        )

    def stop(self) -> None:
        """Stop serving and remove both sockets (prepared claims stay in their store, leases in the pool)."""
        self.stopping.set()
        for server in self._servers:
            server.stop(grace=1).wait()
        self._servers.clear()
        for path in (self.registration_socket, self.service_socket):
            _unlink(path)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def publish_slice(self) -> bool:
        """Publish the node's slice if it changed; an API server that fails is logged and retried."""
        try:
            return self.slices.publish(self.pool.devices())
        except ApiError as err:
            log.warning("publishing the ResourceSlice failed (will retry): %s", err)
            return False

    def _loop(self) -> None:
        since_renewal = self.config.renew_every_s  # renew at once: a restarted plugin's leases
        while not self.stopping.wait(self.config.slice_every_s if self.config.slice_every_s > 0 else 1.0):
            since_renewal += self.config.slice_every_s
            try:
                self.publish_slice()
                if since_renewal >= self.config.renew_every_s:
                    since_renewal = 0.0
                    self.preparer.renew()
            except Exception:
                log.exception("DRA housekeeping failed")

    def _server(self, name: str) -> grpc.Server:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix=name))
        self._servers.append(server)
        return server

    @staticmethod
    def _bind(server: grpc.Server, path: str) -> None:
        if len(path.encode()) > MAX_SOCKET_PATH:
            raise InvalidInput(f"socket path {path} is longer than a Unix socket allows: use a shorter --kubelet-dir")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _unlink(path)  # left by a plugin that was killed
        server.add_insecure_port(f"unix://{path}")
        server.start()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
