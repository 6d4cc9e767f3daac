"""What each process really uses on each pooled GPU: NVML for real devices, a JSON file for emulated ones.

The emulated seam (env GPUPOOL_EMULATED_USAGE) names a file (isolation/emulated_usage.py has its
shape: MiB per process, and optionally its utilisation and whether it is an MPS client); it is read
at every sample exactly where NVML's running-process lists would be, so accounting and enforcement run in tests with real
processes on machines without GPUs.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...core.model import Device
from ...core.usage import DeviceUsage, ProcessUsage
from ...logs import get_logger
from ..isolation.emulated_usage import SHAPE, Usage, read_usage
from ..isolation.env import EMULATED_USAGE_ENV as EMULATED_USAGE_ENV  # re-exported: its users import it from here
from .health import is_emulated
from .nvml import NvmlUnavailable, load_nvml, shutdown_nvml

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

    Sample = Tuple[Tuple[DeviceUsage, ...], Tuple[ProcessUsage, ...]]

log = get_logger(__name__)

MIB = 1024 * 1024


class UsageSampler:
    """Samples the usage of `devices`; keeps NVML open between samples. `close()` ends it."""

    def __init__(self, devices: Sequence[Device], usage_file: Optional[str] = None) -> None:
        self.devices = list(devices)
        self.usage_file = usage_file if usage_file is not None else os.environ.get(EMULATED_USAGE_ENV, "")
        self._nvml: Any = None
        self._last_seen: Dict[str, int] = {}  # per uuid: NVML timestamp of the newest utilisation sample
        self._warned_file = ""
        self._warned_mps = False
        if any(not is_emulated(d.uuid) for d in self.devices):
            try:
                self._nvml = load_nvml()
            except NvmlUnavailable as err:  # usage is then unknown, never invented
                log.warning("GPU usage cannot be sampled: %s", err.message)

    def sample(self) -> Sample:
        """(per-device usage, per-process usage) of this moment; processes carry no lease yet."""
        devices: List[DeviceUsage] = []
        processes: List[ProcessUsage] = []
        emulated = self._read_usage_file() if any(is_emulated(d.uuid) for d in self.devices) else {}
        for device in self.devices:
            if is_emulated(device.uuid):
                rows = [
                    ProcessUsage(pid, device.uuid, row.memory_mib, row.utilization, mps_client=row.mps_client)
                    for pid, row in emulated.get(device.uuid, {}).items()
                ]
                devices.append(DeviceUsage(device.uuid, sum(r.memory_mib for r in rows), None))
            elif self._nvml is not None:
                usage, rows = self._nvml_sample(device.uuid)
                if usage is None:
                    continue
                devices.append(usage)
            else:
                continue
            processes.extend(rows)
        return tuple(devices), tuple(processes)

    def close(self) -> None:
        if self._nvml is not None:
            shutdown_nvml(self._nvml)
            self._nvml = None

    # --- emulated -------------------------------------------------------------
    def _read_usage_file(self) -> Usage:
        """The usage file; missing is empty, damaged is empty with one warning."""
        path = self.usage_file
        if not path:
            return {}
        try:
            return read_usage(path)
        except OSError as err:
            self._warn_once(path, f"cannot read {EMULATED_USAGE_ENV} file {path}: {err.strerror}")
        except ValueError as err:
            self._warn_once(path, f"{EMULATED_USAGE_ENV} file {path} is not {SHAPE}: {err}")
        return {}

    def _warn_once(self, path: str, message: str) -> None:
        if self._warned_file != path:
            log.warning("%s; usage counts as empty until it is fixed", message)
            self._warned_file = path

    # --- NVML -----------------------------------------------------------------
    def _nvml_sample(self, uuid: str) -> Tuple[Optional[DeviceUsage], List[ProcessUsage]]:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used) // MIB
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception as err:  # a GPU that stopped answering is reported by health, not here
            log.debug("NVML usage of %s failed: %s", uuid, err)
            return None, []
        busy: Optional[float] = None
        try:
            busy = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
        except Exception:
            pass
        # Read after the ordinary list: a process listed there as a client is in this one too (a
        # client connecting in between appears here only), so none is taken for one outside MPS.
        clients = self._mps_clients(handle, uuid)
        sm = self._process_utilization(handle, uuid)
        mib_of: Dict[int, int] = {}
        for proc in [*running, *(clients or [])]:
            # usedGpuMemory is None where the driver cannot tell (e.g. without privileges); a client
            # may be in both lists, with the same memory: counted once.
            mib_of[int(proc.pid)] = max(mib_of.get(int(proc.pid), 0), int(proc.usedGpuMemory or 0) // MIB)
        mps = None if clients is None else {int(proc.pid) for proc in clients}
        rows = [
            ProcessUsage(pid, uuid, mib, sm.get(pid), mps_client=None if mps is None else pid in mps)
            for pid, mib in mib_of.items()
        ]
        return DeviceUsage(uuid, used, busy), rows

    def _mps_clients(self, handle: Any, uuid: str) -> Optional[List[Any]]:
        """The GPU's MPS clients (nvmlDeviceGetMPSComputeRunningProcesses), or None where NVML cannot
        say (a driver or binding without the call): then no process is judged inside or outside MPS.
        The MPS server itself is no client: the ordinary list has it, and it is no lease's process."""
        try:
            return list(self._nvml.nvmlDeviceGetMPSComputeRunningProcesses(handle))
        except Exception as err:
            if not self._warned_mps:
                log.warning("NVML cannot list the MPS clients of %s (%s): processes outside MPS go unseen", uuid, err)
                self._warned_mps = True
            return None

    def _process_utilization(self, handle: Any, uuid: str) -> Dict[int, float]:
        """SM share per pid since the last sample (NVML answers NOT_FOUND when there is none)."""
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, self._last_seen.get(uuid, 0))
        except Exception:
            return {}
        result: Dict[int, float] = {}
        for s in samples:
            result[int(s.pid)] = max(result.get(int(s.pid), 0.0), float(s.smUtil) / 100.0)
            self._last_seen[uuid] = max(self._last_seen.get(uuid, 0), int(s.timeStamp))
        return result
