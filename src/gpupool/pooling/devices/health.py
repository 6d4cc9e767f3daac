"""Device health from NVML XID events, for the kube device plugin.

`device_health(uuids)` is a one-shot check; `HealthWatcher` waits on NVML
critical XID events. Emulated devices are always healthy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...logs import get_logger
from .nvml import NvmlUnavailable, load_nvml, shutdown_nvml

if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, Optional, Set

log = get_logger(__name__)

# XIDs that are the application's fault, not the GPU's (as in NVIDIA's
# k8s-device-plugin): they must not mark a shared device unhealthy.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def is_emulated(uuid: str) -> bool:
    return uuid.startswith("GPU-emu-")


def device_health(uuids: Iterable[str]) -> Dict[str, bool]:
    """Whether each device answers NVML now; emulated devices are always healthy."""
    uuids = list(uuids)
    result = {u: True for u in uuids if is_emulated(u)}
    real = [u for u in uuids if not is_emulated(u)]
    if not real:
        return result
    try:
        nvml = load_nvml()
    except NvmlUnavailable:
        return dict(result, **dict.fromkeys(real, False))
    try:
        for uuid in real:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                nvml.nvmlDeviceGetMemoryInfo(handle)
                result[uuid] = True
            except Exception:
                result[uuid] = False
    finally:
        shutdown_nvml(nvml)
    return result


class HealthWatcher:
    """Waits for critical XID events on real devices; call `poll()` in a loop.

    Keeps NVML initialised while it lives; `close()` ends it.
    """

    def __init__(self, uuids: Iterable[str]) -> None:
        self.unhealthy: Set[str] = set()
        self._uuids = [u for u in uuids if not is_emulated(u)]
        self._nvml: Optional[Any] = None
        self._events: Optional[Any] = None
        if not self._uuids:
            return
        nvml = load_nvml()
        try:
            self._events = nvml.nvmlEventSetCreate()
        except BaseException:
            shutdown_nvml(nvml)  # no watcher to close(): end NVML here
            raise
        self._nvml = nvml
        for uuid in self._uuids:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
            except Exception as err:  # devices without event support stay healthy but are logged
                log.warning("cannot watch XID events of %s: %s", uuid, err)

    def poll(self, timeout_ms: int = 5000) -> Set[str]:
        """Wait up to `timeout_ms` for one event; return the UUIDs now unhealthy."""
        if self._nvml is None or self._events is None:
            return set(self.unhealthy)
        nvml = self._nvml
        try:
            event = nvml.nvmlEventSetWait_v2(self._events, timeout_ms)
        except Exception as err:
            # NVML_ERROR_TIMEOUT is the normal "nothing happened".
            if "Timeout" not in type(err).__name__ and "timeout" not in str(err).lower():
                log.warning("NVML event wait failed: %s", err)
            return set(self.unhealthy)
        xid = int(getattr(event, "eventData", 0))
        if xid in APPLICATION_XIDS:
            return set(self.unhealthy)
        try:
            uuid = nvml.nvmlDeviceGetUUID(event.device)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        except Exception:
            # An event we cannot pin on one device: mark them all, as the reference plugin does.
            self.unhealthy.update(self._uuids)
        else:
            self.unhealthy.add(uuid)
        log.warning("XID %d: devices now unhealthy: %s", xid, sorted(self.unhealthy))
        return set(self.unhealthy)

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlEventSetFree(self._events)
            except Exception:
                pass
            shutdown_nvml(self._nvml)
            self._nvml = None
