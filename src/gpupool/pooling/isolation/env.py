"""The env contract of a `gpupool run` child: which GPUs it sees and how much of each it may use.

Every variable name of the contract is defined here once; the post-import hook
(hook/sitecustomize.py) cannot import gpupool, so it repeats the names it reads
and tests/pooling/isolation checks that they agree.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, NamedTuple

from ...core.errors import InvalidInput
from ...core.isolation_mode import IsolationMode, NodeIsolation
from ...core.model import Device, Lease, Slice

if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence

HOOK_DEBUG_ENV = "GPUPOOL_HOOK_DEBUG"
# The lease a process belongs to; the runner's guard and the server's watchdog find processes by it.
LEASE_ID_ENV = "GPUPOOL_LEASE_ID"
HOOK_DIR_ENV = "GPUPOOL_HOOK_DIR"
# Read from the runner's environment: "off" keeps a lease's processes out of a cgroup of their own
# (the guard, their subreaper, still ends them); "v1" takes the cgroup v1 freezer hierarchy even
# where cgroup v2 is writable; anything else uses cgroup v2 where it is writable, else the v1 freezer.
LEASE_CGROUP_ENV = "GPUPOOL_LEASE_CGROUP"
# Set by `gpupool run --requeue` on a rerun after a preemption: "1", and the attempt number (2 on
# the first rerun), so a command can tell it should resume from its checkpoint.
PREEMPTED_ENV = "GPUPOOL_PREEMPTED"
ATTEMPT_ENV = "GPUPOOL_ATTEMPT"
# The grant, per visible GPU: what the pool accounted for this lease.
MEMORY_LIMIT_ENV = "GPUPOOL_MEMORY_LIMIT_MIB"
MEMORY_FRACTION_ENV = "GPUPOOL_MEMORY_FRACTION"
# What the hook caps the framework's allocator at: the grant less the CUDA context reserve.
ALLOCATOR_LIMIT_ENV = "GPUPOOL_ALLOCATOR_LIMIT_MIB"
ALLOCATOR_FRACTION_ENV = "GPUPOOL_ALLOCATOR_FRACTION"
XLA_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
# Read from the runner's environment: overrides CONTEXT_RESERVE_MIB.
CONTEXT_RESERVE_ENV = "GPUPOOL_CONTEXT_RESERVE_MIB"
# NVIDIA MPS: where the control daemon listens, and the per-client limits it enforces.
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
MPS_MEMORY_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREAD_PERCENTAGE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
# The client's scheduling priority (drivers from CUDA 12.4): a latency-sensitive lease's command runs
# at normal priority and every other lease's below it, so the GPU serves the former's kernels first.
MPS_PRIORITY_ENV = "CUDA_MPS_CLIENT_PRIORITY"
MPS_PRIORITY_NORMAL = "0"
MPS_PRIORITY_BELOW_NORMAL = "1"
# Read from the runner's environment: the seconds a start in `mps` isolation waits for the MPS control
# daemon to answer on its contract's pipe folder (a daemon restarting) before it fails closed: without
# a daemon, CUDA runs the command with no memory or SM limit (default MPS_WAIT_S).
MPS_WAIT_ENV = "GPUPOOL_MPS_WAIT"
MPS_WAIT_S = 30.0
# Where the driver's MPS client looks when no pipe/log folder is in its env.
MPS_DRIVER_PIPE_DIR = "/tmp/nvidia-mps"
MPS_DRIVER_LOG_DIR = "/var/log/nvidia-mps"
# Emulated GPUs: the JSON file of per-process usage ({"GPU-uuid": {"PID": MiB}}) that stands in for
# NVML. devices/usage.py samples it, isolation/parking.py's emulated backend parks entries of it;
# defined here because devices/usage.py pulls in modules an embedded run never loads.
EMULATED_USAGE_ENV = "GPUPOOL_EMULATED_USAGE"
# The runner's suspend backend (isolation/parking.py): "auto" (the default) parks a lease on
# emulated GPUs with the emulated backend and one on real GPUs with the CUDA driver's; "cuda" or
# "emulated" forces one (e.g. "cuda" to see the requeue fallback where no driver is).
SUSPEND_BACKEND_ENV = "GPUPOOL_SUSPEND_BACKEND"
SUSPEND_BACKENDS = ("cuda", "emulated", "auto")
# The devices a pool serves where no --devices flag names them (devices/inventory.py reads it).
DEVICES_ENV = "GPUPOOL_DEVICES"
# Inside a pod: the container's decided claim (JSON, core.model.Claim.to_dict), which the runner
# sends as it is instead of its -n/-p/-m flags. The mutating webhook sets it: from the extender
# bind's `gpupool.io/choice.N` (pinned to the chosen GPUs), or, where the scheduler does not bind
# through the extender, the container's ask itself (kube/mutate.py).
CLAIM_ENV = "GPUPOOL_CLAIM"
# Set by the device plugin's Allocate (kube/deviceplugin): the GPUs the kubelet allocated the
# container's units on (UUIDs, comma separated) and how many units; the runner pins an unpinned
# claim to those GPUs and checks a pinned one against them (runner/podclaim.py).
ALLOCATED_GPUS_ENV = "GPUPOOL_ALLOCATED_GPUS"
UNITS_ENV = "GPUPOOL_UNITS"

# Device memory each process pays for its CUDA context (kernels, handles, workspaces)
# outside the framework's caching allocator. Measured by `make gpu-check`
# (benchmarks/results/gpu-isolation.json, "context_overhead_mib"): about 680 MiB for
# torch 2.11 + cuBLAS on an H100, so two half shares each filling their allocator cap
# ran out of memory at their next kernel load with the earlier 512.
CONTEXT_RESERVE_MIB = 768
# The allocator keeps at least this share of the grant however large the reserve,
# so a small share still runs (and may then overrun its grant by the context).
MIN_ALLOCATOR_SHARE = 0.25


class GpuShare(NamedTuple):
    """One visible GPU of the child: its UUID, the MiB it may use and that share of the device."""

    uuid: str
    memory_mib: int
    device_memory_mib: int

    @property
    def fraction(self) -> float:
        # Rounded down, so a framework limit never exceeds what the pool granted.
        if self.device_memory_mib <= 0:
            return 1.0
        return _floor4(self.memory_mib / self.device_memory_mib)

    def allocator_mib(self, reserve_mib: int) -> int:
        """The framework allocator's cap: the grant less the context reserve, never below the floor."""
        floor = math.ceil(self.memory_mib * MIN_ALLOCATOR_SHARE)
        return max(self.memory_mib - max(reserve_mib, 0), floor, 1)

    def allocator_fraction(self, reserve_mib: int) -> float:
        """`allocator_mib` as a share of the whole device (what torch's memory fraction takes)."""
        if self.device_memory_mib <= 0:
            return 1.0
        return _floor4(self.allocator_mib(reserve_mib) / self.device_memory_mib)


def _floor4(share: float) -> float:
    return max(math.floor(share * 10000) / 10000, 0.0001)


def shares(lease: Lease, devices: Sequence[Device], group: Optional[int] = None) -> List[GpuShare]:
    """The GPUs of `lease` (one request `group`, or all) in visible order, sized from `devices`."""
    by_uuid: Dict[str, Device] = {d.uuid: d for d in devices}
    chosen: Sequence[Slice] = lease.slices if group is None else lease.group(group)
    result = []
    for s in chosen:
        device = by_uuid.get(s.device_uuid)
        # An unknown device (inventory changed) still gets its MiB limit; the fraction is then 1.
        total = device.memory_mib if device is not None else s.memory_mib
        result.append(GpuShare(s.device_uuid, s.memory_mib, total))
    return result


def context_reserve_mib(environ: Optional[Mapping[str, str]] = None) -> int:
    """The CUDA context reserve in MiB: $GPUPOOL_CONTEXT_RESERVE_MIB, else CONTEXT_RESERVE_MIB."""
    text = (os.environ if environ is None else environ).get(CONTEXT_RESERVE_ENV, "").strip()
    if not text:
        return CONTEXT_RESERVE_MIB
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidInput(
            f"{CONTEXT_RESERVE_ENV}={text!r} is not a whole number of MiB: set it to e.g. "
            f"{CONTEXT_RESERVE_MIB} (the CUDA context size `make gpu-check` measured), or unset it"
        )
    return value


def _fmt(fraction: float) -> str:
    return f"{fraction:.4f}".rstrip("0").rstrip(".")


def isolation_env(
    lease_id: str,
    gpus: Sequence[GpuShare],
    hook_dir: Optional[str] = None,
    *,
    isolation: NodeIsolation = NodeIsolation(),
    reserve_mib: Optional[int] = None,
    latency_sensitive: bool = False,
) -> Dict[str, str]:
    """The contract variables for a child holding `gpus` on a node isolated by `isolation`.

    Args:
        isolation: the node's mode (`PoolStatus.isolation`); `hooks` when not known.
        reserve_mib: the CUDA context reserve; None reads $GPUPOOL_CONTEXT_RESERVE_MIB or the default.
        latency_sensitive: in `mps` mode, the command's kernels go before other leases' (client priority).
    The contract is described in docs/architecture/isolation.md.
    """
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus),
        LEASE_ID_ENV: lease_id,
    }
    if isolation.mode is IsolationMode.NONE:
        return env
    reserve = context_reserve_mib() if reserve_mib is None else reserve_mib
    env[MEMORY_LIMIT_ENV] = ",".join(str(g.memory_mib) for g in gpus)
    env[MEMORY_FRACTION_ENV] = ",".join(_fmt(g.fraction) for g in gpus)
    env[ALLOCATOR_LIMIT_ENV] = ",".join(str(g.allocator_mib(reserve)) for g in gpus)
    env[ALLOCATOR_FRACTION_ENV] = ",".join(_fmt(g.allocator_fraction(reserve)) for g in gpus)
    if gpus:
        # One value for all GPUs: the smallest allocator share, so JAX never overruns.
        env[XLA_FRACTION_ENV] = _fmt(min(g.allocator_fraction(reserve) for g in gpus))
    if isolation.mode is IsolationMode.MPS:
        env.update(mps_env(gpus, isolation, latency_sensitive))
    if hook_dir:
        env[HOOK_DIR_ENV] = hook_dir
    return env


def mps_env(gpus: Sequence[GpuShare], isolation: NodeIsolation, latency_sensitive: bool = False) -> Dict[str, str]:
    """The MPS client variables: the daemon's folders, the per-client limits the MPS server enforces, the priority."""
    env = {
        # MPS numbers devices as the client sees them, i.e. after CUDA_VISIBLE_DEVICES.
        # The whole grant: MPS clients share the server's context, so no reserve is taken off.
        MPS_MEMORY_LIMIT_ENV: ",".join(f"{i}={g.memory_mib}M" for i, g in enumerate(gpus)),
    }
    # Empty folders (a node that did not say) leave the driver's defaults (/tmp/nvidia-mps).
    if isolation.mps_pipe_dir:
        env[MPS_PIPE_ENV] = isolation.mps_pipe_dir
    if isolation.mps_log_dir:
        env[MPS_LOG_ENV] = isolation.mps_log_dir
    if gpus:
        # One value for all GPUs: take the largest share, so compute never starves.
        env[MPS_THREAD_PERCENTAGE_ENV] = str(min(100, max(1, math.ceil(max(g.fraction for g in gpus) * 100 - 1e-9))))
    # Every lease below normal unless it asked to go first: among equals the order is unchanged.
    env[MPS_PRIORITY_ENV] = MPS_PRIORITY_NORMAL if latency_sensitive else MPS_PRIORITY_BELOW_NORMAL
    return env


def child_env(base: Mapping[str, str], contract: Mapping[str, str]) -> Dict[str, str]:
    """`base` (the runner's env) with `contract` applied and the hook dir first on PYTHONPATH."""
    env = dict(base)
    env.update(contract)
    hook_dir = contract.get(HOOK_DIR_ENV)
    if hook_dir:
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != hook_dir]
        env["PYTHONPATH"] = os.pathsep.join([hook_dir] + rest)
    return env
