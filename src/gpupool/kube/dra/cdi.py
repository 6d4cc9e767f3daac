"""CDI specs (the Container Device Interface, cdi.k8s.io): one JSON file per prepared claim in the
CDI folder the container runtime reads (/var/run/cdi), written atomically and removed at unprepare.

The runtime applies a device's `containerEdits` (env, mounts) to every container the kubelet
hands that device's fully qualified name, "VENDOR/CLASS=NAME".
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

# env and mounts in containerEdits are in every CDI version since 0.3.0; 0.5.0 is what containerd
# 1.7 and CRI-O 1.28 (the oldest runtimes Kubernetes 1.34 supports with CDI) read without trouble.
CDI_VERSION = "0.5.0"
CDI_CLASS = "gpu"
DEFAULT_CDI_DIR = "/var/run/cdi"


@dataclass(frozen=True)
class CdiMount:
    """A bind mount into the container."""

    host_path: str
    container_path: str
    read_only: bool = True

    def to_dict(self) -> Dict[str, Any]:
        options = ["ro" if self.read_only else "rw", "nosuid", "nodev", "bind"]
        return {"hostPath": self.host_path, "containerPath": self.container_path, "options": options}


@dataclass(frozen=True)
class CdiDevice:
    """One CDI device: its name (unique in its kind) and what it does to a container."""

    name: str
    env: Mapping[str, str]
    mounts: Sequence[CdiMount] = field(default_factory=tuple)

    def to_dict(self) -> Dict[str, Any]:
        edits: Dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(self.env.items())]}
        if self.mounts:
            edits["mounts"] = [m.to_dict() for m in self.mounts]
        return {"name": self.name, "containerEdits": edits}


def kind(vendor: str) -> str:
    """The CDI kind of gpupool's devices for driver `vendor`: 'gpu.gpupool.io/gpu'."""
    return f"{vendor}/{CDI_CLASS}"


def qualified_name(vendor: str, name: str) -> str:
    """What the kubelet hands the runtime: 'gpu.gpupool.io/gpu=NAME'."""
    return f"{kind(vendor)}={name}"


def spec_path(cdi_dir: str, vendor: str, claim_uid: str) -> Path:
    """Where the spec of claim `claim_uid` lives (one file per claim, so unprepare removes it whole)."""
    return Path(cdi_dir) / f"{vendor}-claim_{claim_uid}.json"


def spec(vendor: str, devices: Sequence[CdiDevice]) -> Dict[str, Any]:
    """The spec document."""
    return {"cdiVersion": CDI_VERSION, "kind": kind(vendor), "devices": [d.to_dict() for d in devices]}


def write_spec(cdi_dir: str, vendor: str, claim_uid: str, devices: Sequence[CdiDevice]) -> List[str]:
    """Write the claim's spec (atomically: a runtime never reads half a file) and return the devices'
    qualified names."""
    path = spec_path(cdi_dir, vendor, claim_uid)
    write_json_atomically(path, spec(vendor, devices))
    return [qualified_name(vendor, d.name) for d in devices]


def remove_spec(cdi_dir: str, vendor: str, claim_uid: str) -> None:
    """Remove the claim's spec; a spec already gone is fine (unprepare is idempotent)."""
    try:
        os.unlink(spec_path(cdi_dir, vendor, claim_uid))
    except FileNotFoundError:
        pass


def write_json_atomically(path: Path, document: Mapping[str, Any]) -> None:
    """Write `document` to a temporary file beside `path`, fsync it, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=2, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
