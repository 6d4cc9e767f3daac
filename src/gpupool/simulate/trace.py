"""Trace readers: a cluster (openb node CSV, or `gpupool status --json` of a live pool) and a workload (openb pod CSV)."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core.errors import InvalidInput
from ..core.fragmentation import MILLI, NodeFree, TaskShape

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


@dataclass(frozen=True)
class NodeSpec:
    """One node of the simulated cluster, empty."""

    name: str
    gpus: int
    model: str
    cpu_milli: Optional[int] = None  # None: not reported, not counted
    memory_mib: Optional[int] = None
    gpus_free: Optional[Tuple[int, ...]] = None  # per-GPU free share when read from a live pool; None: all free

    def free(self) -> NodeFree:
        gpus = self.gpus_free if self.gpus_free is not None else (MILLI,) * self.gpus
        return NodeFree(tuple(gpus), self.cpu_milli, self.memory_mib, self.model)


@dataclass(frozen=True)
class Task:
    """One task of the workload: its shape and, for the timeline mode, when it lived."""

    name: str
    shape: TaskShape
    created: float = 0.0
    deleted: Optional[float] = None


def _rows(path: Path, required: Sequence[str]) -> List[Dict[str, str]]:
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise InvalidInput(
                    f"{path}: missing column(s) {', '.join(missing)}; expected at least {', '.join(required)}"
                )
            return list(reader)
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file; give the CSV's path") from None


def _int(row: Mapping[str, str], key: str, path: Path, default: int = 0) -> int:
    text = (row.get(key) or "").strip()
    if not text or text.lower() == "nan":
        return default
    try:
        return int(float(text))
    except ValueError:
        raise InvalidInput(
            f"{path}: {key}={text!r} in row {row.get('name') or row.get('sn')!r} is not a number"
        ) from None


def read_nodes(path: Path) -> List[NodeSpec]:
    """The openb node list (`sn,cpu_milli,memory_mib,gpu,model`); nodes without GPUs are kept (CPU-only tasks use them)."""
    path = Path(path)
    if path.suffix == ".json":
        return read_status(path)
    nodes = []
    for row in _rows(path, NODE_COLUMNS):
        model = (row.get("model") or "").strip()
        nodes.append(
            NodeSpec(
                name=row["sn"],
                gpus=_int(row, "gpu", path),
                model="" if model.lower() == "nan" else model,
                cpu_milli=_int(row, "cpu_milli", path),
                memory_mib=_int(row, "memory_mib", path),
            )
        )
    if not nodes:
        raise InvalidInput(f"{path}: no nodes")
    return nodes


def read_status(path: Path) -> List[NodeSpec]:
    """The cluster of a live pool, from `gpupool status --json` (one object, or a list of them, one per node).

    A GPU's free share is its free memory over its size; CPU and memory are not reported, so not counted.
    """
    try:
        data: Any = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file; save `gpupool status --json` there") from None
    except ValueError as err:
        raise InvalidInput(f"{path}: not JSON ({err}); save `gpupool status --json` there") from None
    statuses = data if isinstance(data, list) else [data]
    by_node: Dict[str, List[Dict[str, Any]]] = {}
    for status in statuses:
        if not isinstance(status, dict) or not isinstance(status.get("devices"), list):
            raise InvalidInput(f"{path}: expected the object of `gpupool status --json`, with a 'devices' list")
        for d in status["devices"]:
            if d.get("healthy", True):
                by_node.setdefault(str(d.get("node") or status.get("node") or "localhost"), []).append(d)
    nodes = []
    for name, devices in by_node.items():
        devices.sort(key=lambda d: int(d.get("index", 0)))
        free = tuple(
            max(0, (int(d["memory_mib"]) - int(d.get("allocated_mib", 0))) * MILLI // max(1, int(d["memory_mib"])))
            for d in devices
        )
        models = {str(d.get("name", "")) for d in devices}
        nodes.append(NodeSpec(name, len(devices), models.pop() if len(models) == 1 else "", gpus_free=free))
    if not nodes:
        raise InvalidInput(f"{path}: the pool reports no healthy GPUs")
    return nodes


def read_tasks(path: Path) -> List[Task]:
    """The openb pod list: `num_gpu` GPUs at `gpu_milli` each (whole GPUs when several), `gpu_spec` models split on '|'."""
    path = Path(path)
    tasks = []
    for row in _rows(path, POD_COLUMNS):
        gpus = _int(row, "num_gpu", path)
        milli = _int(row, "gpu_milli", path) if gpus else 0
        if gpus and (milli <= 0 or milli > MILLI or gpus > 1):
            milli = MILLI  # multi-GPU tasks ask for whole GPUs
        spec = (row.get("gpu_spec") or "").strip()
        models = tuple(m for m in spec.split("|") if m and m.lower() != "nan")
        deleted_text = (row.get("deletion_time") or "").strip()
        tasks.append(
            Task(
                name=row["name"],
                shape=TaskShape(gpus, milli, _int(row, "cpu_milli", path), _int(row, "memory_mib", path), models),
                created=float(_int(row, "creation_time", path)),
                deleted=float(_int(row, "deletion_time", path))
                if deleted_text and deleted_text.lower() != "nan"
                else None,
            )
        )
    if not tasks:
        raise InvalidInput(f"{path}: no tasks")
    return tasks
