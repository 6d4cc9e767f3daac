"""The mutating webhook's decision: a pod in, a JSONPatch and warnings out (pure, no I/O).

It translates GPU resources to `gpupool.io/gpu` units, injects the runner
zipapp (init container + emptyDir), the token Secret, downward-API identity,
and wraps each GPU container's command with `gpupool-run run ... --`.
In MPS mode (`mps_pipe_dir` set) GPU containers also get the node agent's MPS
pipe folder and shared-memory folder, as NVIDIA's device plugin gives its MPS clients.
A pod carrying the marker annotation is left alone, so a second pass is a no-op.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..core.errors import InvalidInput
from ..core.filters import Filter
from ..core.model import Claim, Policy
from ..pooling.isolation.env import CLAIM_ENV, MPS_PIPE_ENV
from . import annotations as ann
from .resources import ALIASES, UNITS, USER_KEYS, GpuAsk, asks_for_gpu, read_ask

RUNNER_VOLUME = "gpupool-runner"
TOKEN_VOLUME = "gpupool-token"
INSTALL_CONTAINER = "gpupool-runner-install"
POD_LABEL = "pod:$(GPUPOOL_POD_NAMESPACE)/$(GPUPOOL_POD_NAME):$(GPUPOOL_POD_UID)"
MPS_PIPE_VOLUME = "gpupool-mps-pipe"
MPS_SHM_VOLUME = "gpupool-mps-shm"
# MPS clients and their server exchange shared memory through /dev/shm, so the
# container's must be the agent's (NVIDIA's device plugin mounts it the same way).
SHM_PATH = "/dev/shm"


@dataclass(frozen=True)
class MutateConfig:
    """Cluster-wide settings of the injection (flags of `gpupool kube webhook`)."""

    runner_image: str = "ghcr.io/gpupool/gpupool:0.1.0"
    runner_source: str = "/opt/gpupool/gpupool-run.pyz"  # where the image keeps the zipapp
    mount_path: str = "/gpupool"
    python: str = "python3"
    agent_port: int = 56001
    agent_scheme: str = "http"
    token_secret: str = "gpupool-client"
    token_path: str = "/etc/gpupool"
    lib_dir: str = "/gpupool/lib"
    gpu_memory_mib: Optional[int] = None  # fallback GPU size for gpu-memory asks
    wait_s: float = 300.0  # the runner queues this long if a just-ended pod's lease is not yet released
    # MPS mode: the agent's pipe folder (its --state + /mps/pipe), mounted at the same path; "" = not MPS.
    mps_pipe_dir: str = ""
    mps_shm_dir: str = "/run/gpupool/mps/shm"  # host folder the agent mounts as its /dev/shm
    # The extender binds (scheduler-config's default): each runner sends the claim the bind recorded
    # for its container (`gpupool.io/choice.N`, pinned to the chosen GPUs; through the downward API).
    # Off (--no-bind) for a scheduler that does not bind through the extender: the runner then gets
    # its container's ask and pins it to the GPUs the device plugin allocated.
    pin_choice: bool = True

    def __post_init__(self) -> None:
        for flag, path in (("--mps-pipe-dir", self.mps_pipe_dir), ("--mps-shm-dir", self.mps_shm_dir)):
            if path and not path.startswith("/"):
                raise InvalidInput(
                    f"{flag} {path!r} must be an absolute host path, e.g. "
                    f"/var/lib/gpupool/mps/pipe (the agent's --state + /mps/pipe)"
                )

    @property
    def runner_path(self) -> str:
        return f"{self.mount_path}/gpupool-run.pyz"


@dataclass
class Mutation:
    """The outcome: JSONPatch operations (empty = nothing to do) and warnings for the user."""

    patch: List[Dict[str, Any]] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)


def mutate(
    pod: Mapping[str, Any], config: MutateConfig, gpu_size: Callable[[int], Optional[int]] = lambda m: None
) -> Mutation:
    """Patch for `pod`; raises InvalidInput (a deny, with the fix) on bad GPU asks.

    Args:
        gpu_size: MiB of the GPU a `gpu-memory` ask is rounded against (None: unknown).
    """
    meta = pod.get("metadata") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    if annotations.get(ann.MARKER):
        return Mutation()
    injection = ann.read_injection(annotations)
    if injection.mode is ann.Mode.NONE:
        return Mutation()
    errors: List[str] = []
    errors.extend(init_container_errors(spec))
    asks: Dict[str, GpuAsk] = {}
    for container in spec.get("containers") or []:
        ask, problems = read_ask(container)
        errors.extend(problems)
        if ask is not None:
            asks[container["name"]] = ask
    filters: Tuple[Filter, ...] = ()
    policy = Policy.FRAGAWARE
    try:
        filters = ann.read_filters(annotations)
        policy = ann.read_policy(annotations)
    except InvalidInput as err:
        errors.append(err.message)
    if not asks and not errors:
        return Mutation()
    out = Mutation(warnings=ann.ignored_warnings(annotations))
    containers = []
    for index, container in enumerate(spec.get("containers") or []):
        ask = asks.get(container["name"])
        if ask is None:
            continue
        try:
            new = _container(
                container,
                ask,
                config,
                gpu_size,
                injection.wraps(container["name"]),
                (filters, policy),
                out.warnings,
                index,
            )
        except InvalidInput as err:
            errors.append(err.message)
            continue
        containers.append((index, new))
    if errors:
        raise InvalidInput("; ".join(errors))
    for index, new in containers:
        out.patch.append({"op": "replace", "path": f"/spec/containers/{index}", "value": new})
    _add_init_container(spec, config, out.patch)
    _add_volumes(spec, config, out.patch)
    _add_annotations(meta, {ann.MARKER: ann.MARKER_VALUE, ann.CLAIM: ann.encode_claim(asks)}, out.patch)
    return out


def _container(
    container: Mapping[str, Any],
    ask: GpuAsk,
    config: MutateConfig,
    gpu_size: Callable[[int], Optional[int]],
    wrap: bool,
    rules: Tuple[Tuple[Filter, ...], Policy],
    warnings: List[str],
    index: int,
) -> Dict[str, Any]:
    new: Dict[str, Any] = _copy(dict(container))
    name = container["name"]
    size = gpu_size(ask.memory_mib) if ask.memory_mib is not None else None
    units = ask.units(size or config.gpu_memory_mib)
    resources = new.setdefault("resources", {})
    for section in ("limits", "requests"):
        values = {k: v for k, v in (resources.get(section) or {}).items() if k not in USER_KEYS and k not in ALIASES}
        # Extended resources cannot be overcommitted: requests must equal limits.
        values[UNITS] = str(units)
        resources[section] = values
    new["env"] = _env(container.get("env") or [], config, name, warnings)
    if not any(e.get("name") == CLAIM_ENV for e in new["env"]):
        new["env"].append(_claim_env(ask, rules, config, index))
    mounts = list(container.get("volumeMounts") or [])
    taken = {m.get("mountPath") for m in mounts} | {m.get("name") for m in mounts}
    for volume, path in ((RUNNER_VOLUME, config.mount_path), (TOKEN_VOLUME, config.token_path)):
        if volume not in taken and path not in taken:
            mounts.append({"name": volume, "mountPath": path, "readOnly": True})
    if config.mps_pipe_dir:
        _add_mps_mounts(mounts, taken, config, name, warnings)
    new["volumeMounts"] = mounts
    if wrap:
        new["command"] = _wrapped_command(container, config, warnings)
    return new


def _claim_env(
    ask: GpuAsk, rules: Tuple[Tuple[Filter, ...], Policy], config: MutateConfig, index: int
) -> Dict[str, Any]:
    """$GPUPOOL_CLAIM, the claim the container's runner sends: the one the extender's bind records
    for it (`gpupool.io/choice.N`, through the downward API), or without binding its ask as is."""
    if config.pin_choice:
        path = f"metadata.annotations['{ann.chosen_gpu_key(index)}']"
        return {"name": CLAIM_ENV, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}
    filters, policy = rules
    text = json.dumps(Claim((ask.request(filters),), policy).to_dict(), sort_keys=True, separators=(",", ":"))
    return {"name": CLAIM_ENV, "value": text.replace("$", "$$")}  # the kubelet expands $(VAR) in values


def _add_mps_mounts(
    mounts: List[Dict[str, Any]], taken: Set[Optional[str]], config: MutateConfig, name: str, warnings: List[str]
) -> None:
    """The agent's MPS pipe folder (same path) and shared memory (/dev/shm); read-write, MPS writes both."""
    if MPS_PIPE_VOLUME not in taken and config.mps_pipe_dir not in taken:
        mounts.append({"name": MPS_PIPE_VOLUME, "mountPath": config.mps_pipe_dir})
    if MPS_SHM_VOLUME in taken:
        return
    if SHM_PATH in taken:
        warnings.append(
            f"container {name!r} mounts its own {SHM_PATH}, which MPS needs to share with the "
            f"node agent's MPS server: CUDA will not reach the server (and the share is then held "
            f"by the import hook only); remove that volumeMount"
        )
        return
    mounts.append({"name": MPS_SHM_VOLUME, "mountPath": SHM_PATH})


def _copy(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars), several times cheaper than copy.deepcopy;
    anything else (tuples, other mappings from a Python caller) goes to copy.deepcopy."""
    kind = type(value)
    if kind is dict:
        return {k: _copy(v) for k, v in value.items()}
    if kind is list:
        return [_copy(v) for v in value]
    if kind in (str, int, float, bool) or value is None:
        return value
    return copy.deepcopy(value)


def _wrapped_command(container: Mapping[str, Any], config: MutateConfig, warnings: List[str]) -> List[str]:
    """`python3 gpupool-run.pyz run --wait W ... -- <the original command>`; args stay as they are.
    The share is not repeated here: the runner sends $GPUPOOL_CLAIM."""
    name = container["name"]
    command: Sequence[str] = container.get("command") or []
    args: Sequence[str] = container.get("args") or []
    if not command and not args:
        raise InvalidInput(
            f"container {name!r} asks for a GPU but has neither command nor args, so gpupool cannot wrap "
            f'the image\'s entrypoint; set command (e.g. command: ["python", "train.py"]), or set the '
            f"annotation {ann.INJECT}: injection-only and call {config.runner_path} yourself"
        )
    runner = [config.python, config.runner_path, "run"]
    runner += ["--wait", f"{config.wait_s:g}", "--server", "$(GPUPOOL_SERVER)", "--label", POD_LABEL, "--"]
    if not command:
        warnings.append(
            f"container {name!r} has args but no command: its args run as the command under "
            "gpupool-run and the image's ENTRYPOINT is bypassed; set command to keep it"
        )
        return runner
    if len(command) == 1 and not args and any(c.isspace() for c in command[0].strip()):
        # Bitfusion's demo pods write a whole shell line as one string; Bitfusion ran it
        # through a shell, and exec would fail on it, so do the same.
        warnings.append(f"container {name!r}: the one-string command runs through /bin/sh -c, as Bitfusion did")
        return runner + ["/bin/sh", "-c", command[0]]
    return runner + list(command)


def _env(
    env: Sequence[Mapping[str, Any]], config: MutateConfig, name: str, warnings: List[str]
) -> List[Dict[str, Any]]:
    """The container's env with gpupool's appended; existing names are never replaced."""
    out = [dict(e) for e in env]
    have = {e.get("name") for e in out}

    def field_ref(path: str) -> Dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}

    # Order matters: $(VAR) references only see variables defined earlier in the list.
    wanted = [
        ("GPUPOOL_POD_NAME", field_ref("metadata.name")),
        ("GPUPOOL_POD_NAMESPACE", field_ref("metadata.namespace")),
        ("GPUPOOL_POD_UID", field_ref("metadata.uid")),
        ("GPUPOOL_NODE_NAME", field_ref("spec.nodeName")),
        ("GPUPOOL_NODE_IP", field_ref("status.hostIP")),
        ("GPUPOOL_SERVER", {"value": f"{config.agent_scheme}://$(GPUPOOL_NODE_IP):{config.agent_port}"}),
        # The node agent's token, from the namespace's Secret; optional so pods without it still start.
        (
            "GPUPOOL_TOKEN",
            {"valueFrom": {"secretKeyRef": {"name": config.token_secret, "key": "token", "optional": True}}},
        ),
    ]
    if config.agent_scheme == "https":
        wanted.append(("GPUPOOL_CA", {"value": f"{config.token_path}/ca.crt"}))
    if config.mps_pipe_dir:
        # Also for injection-only containers that start gpupool-run themselves, or not at all.
        wanted.append((MPS_PIPE_ENV, {"value": config.mps_pipe_dir}))
    for var, source in wanted:
        if var not in have:
            out.append(dict({"name": var}, **source))
    for e in out:
        if e.get("name") == "LD_LIBRARY_PATH":
            if "value" in e and e["value"] is not None:
                parts = str(e["value"]).split(":") if e["value"] else []
                if config.lib_dir not in parts:
                    e["value"] = ":".join(parts + [config.lib_dir])
            else:
                warnings.append(
                    f"container {name!r}: LD_LIBRARY_PATH comes from valueFrom and is left "
                    f"as is; add {config.lib_dir} to it yourself if you use gpupool's libraries"
                )
    # An unset LD_LIBRARY_PATH is left unset: setting it here would hide the image's own value.
    return out


def _add_init_container(spec: Mapping[str, Any], config: MutateConfig, patch: List[Dict[str, Any]]) -> None:
    inits = spec.get("initContainers") or []
    if any(c.get("name") == INSTALL_CONTAINER for c in inits):
        return
    install = {
        "name": INSTALL_CONTAINER,
        "image": config.runner_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["cp", config.runner_source, config.runner_path],
        "volumeMounts": [{"name": RUNNER_VOLUME, "mountPath": config.mount_path}],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},  # Pod Security "restricted" asks it of every container
        },
    }
    # First, so that the pod's own init containers could already use the runner.
    if inits:
        patch.append({"op": "add", "path": "/spec/initContainers/0", "value": install})
    else:
        patch.append({"op": "add", "path": "/spec/initContainers", "value": [install]})


def _add_volumes(spec: Mapping[str, Any], config: MutateConfig, patch: List[Dict[str, Any]]) -> None:
    volumes = spec.get("volumes") or []
    names = {v.get("name") for v in volumes}
    new = [
        {"name": RUNNER_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
        # optional: a pod in a namespace without the Secret still starts; the runner then says what is missing.
        {"name": TOKEN_VOLUME, "secret": {"secretName": config.token_secret, "optional": True}},
    ]
    if config.mps_pipe_dir:
        # DirectoryOrCreate: a pod that starts before the agent created the folders still starts.
        new.append({"name": MPS_PIPE_VOLUME, "hostPath": {"path": config.mps_pipe_dir, "type": "DirectoryOrCreate"}})
        new.append({"name": MPS_SHM_VOLUME, "hostPath": {"path": config.mps_shm_dir, "type": "DirectoryOrCreate"}})
    new = [v for v in new if v["name"] not in names]
    if not new:
        return
    if "volumes" not in spec or spec.get("volumes") is None:
        patch.append({"op": "add", "path": "/spec/volumes", "value": new})
    else:
        patch.extend({"op": "add", "path": "/spec/volumes/-", "value": v} for v in new)


def _add_annotations(meta: Mapping[str, Any], values: Mapping[str, str], patch: List[Dict[str, Any]]) -> None:
    if meta.get("annotations") is None:
        patch.append({"op": "add", "path": "/metadata/annotations", "value": dict(values)})
        return
    for key, value in values.items():
        patch.append({"op": "add", "path": "/metadata/annotations/" + _pointer(key), "value": value})


def _pointer(key: str) -> str:
    """Escape one JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def init_container_errors(spec: Mapping[str, Any]) -> List[str]:
    """GPU asks in init containers, which gpupool does not serve."""
    return [
        f"init container {c.get('name')!r} asks for a GPU; gpupool shares GPUs with regular "
        "containers only: move the GPU work to one of spec.containers"
        for c in spec.get("initContainers") or []
        if c.get("name") != INSTALL_CONTAINER and asks_for_gpu(c)
    ]
