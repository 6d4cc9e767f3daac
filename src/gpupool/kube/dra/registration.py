"""The kubelet's plugin registration (pluginregistration.Registration): the plugin serves it on a
socket in the kubelet's plugins_registry folder; the kubelet finds the socket, asks GetInfo
and answers with NotifyRegistrationStatus."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import grpc

from . import pluginregistration_pb2 as pb
from . import pluginregistration_pb2_grpc as rpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"  # k8s.io/kubelet/pkg/apis/pluginregistration/v1 constants.go
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)  # the gRPC service k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin
REGISTRY_DIR = "plugins_registry"
PLUGINS_DIR = "plugins"
SERVICE_SOCKET = "dra.sock"


def kubelet_root(kubelet_dir: str) -> str:
    """The kubelet's root folder from the agent's --kubelet-dir: the parent of the device-plugin
    folder it names by default (/var/lib/kubelet/device-plugins -> /var/lib/kubelet), else itself."""
    path = os.path.normpath(kubelet_dir)
    return os.path.dirname(path) if os.path.basename(path) == "device-plugins" else path


def registration_socket(root: str, driver: str) -> str:
    """ROOT/plugins_registry/DRIVER-reg.sock, where the kubelet's plugin watcher looks."""
    return os.path.join(root, REGISTRY_DIR, f"{driver}-reg.sock")


def service_socket(root: str, driver: str) -> str:
    """ROOT/plugins/DRIVER/dra.sock: the DRAPlugin service the registration points the kubelet to."""
    return os.path.join(root, PLUGINS_DIR, driver, SERVICE_SOCKET)


# The generated stubs are untyped (excluded from mypy, imported as Any): subclassing them is the gRPC idiom.
class RegistrationService(rpc.RegistrationServicer):  # type: ignore[misc]
    """GetInfo names the driver and its service socket; the kubelet's verdict is kept and logged."""

    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver, self.endpoint = driver, endpoint
        self.registered = threading.Event()
        self.error = ""

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> pb.PluginInfo:
        return pb.PluginInfo(
            type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint, supported_versions=list(SUPPORTED_VERSIONS)
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> pb.RegistrationStatusResponse:
        if request.plugin_registered:
            self.error = ""
            self.registered.set()
            log.info("DRA driver %s registered with the kubelet", self.driver)
        else:
            self.error = request.error
            self.registered.clear()
            log.error("the kubelet refused DRA driver %s: %s", self.driver, request.error)
        return pb.RegistrationStatusResponse()
