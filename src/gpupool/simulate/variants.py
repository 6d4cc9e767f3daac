"""Workload variants: the same tasks with more sharing, more multi-GPU tasks, more CPU-only tasks or GPU-model
constraints (the FGD paper stresses its policies the same way). Each draws from the given workload with a seed."""

from __future__ import annotations

import random
from typing import Callable, Dict, List, Sequence

from ..core.errors import InvalidInput
from ..core.fragmentation import MILLI, TaskShape
from .trace import NodeSpec, Task


def _is_share(t: Task) -> bool:
    return t.shape.gpus == 1 and t.shape.milli < MILLI


def _is_multi(t: Task) -> bool:
    return t.shape.gpus > 1


def _mix(tasks: Sequence[Task], chosen: Callable[[Task], bool], fraction: float, seed: int) -> List[Task]:
    """As many GPU tasks as before, `fraction` of them drawn from those `chosen` picks, the rest from the others."""
    rng = random.Random(seed)
    gpu = [t for t in tasks if t.shape.gpus]
    yes = [t for t in gpu if chosen(t)]
    no = [t for t in gpu if not chosen(t)]
    if not yes or not no:
        raise InvalidInput("the workload has no tasks of one of the two kinds to mix")
    out = [t for t in tasks if not t.shape.gpus]
    for i in range(len(gpu)):
        src = yes if rng.random() < fraction else no
        t = src[rng.randrange(len(src))]
        out.append(Task(f"{t.name}-v{i}", t.shape, t.created, t.deleted))
    return out


def more_sharing(tasks: Sequence[Task], fraction: float = 0.8, seed: int = 0) -> List[Task]:
    """GPU tasks of which `fraction` share a GPU."""
    return _mix(tasks, _is_share, fraction, seed)


def more_multi_gpu(tasks: Sequence[Task], fraction: float = 0.3, seed: int = 0) -> List[Task]:
    """GPU tasks of which `fraction` ask for several GPUs."""
    return _mix(tasks, _is_multi, fraction, seed)


def more_cpu_only(tasks: Sequence[Task], factor: float = 2.5, seed: int = 0) -> List[Task]:
    """`factor` times as many CPU-only tasks (drawn from those there are), the GPU tasks as they are."""
    rng = random.Random(seed)
    cpu = [t for t in tasks if not t.shape.gpus]
    if not cpu:
        raise InvalidInput("the workload has no CPU-only tasks to multiply")
    out = [t for t in tasks if t.shape.gpus]
    for i in range(int(round(len(cpu) * factor))):
        t = cpu[rng.randrange(len(cpu))]
        out.append(Task(f"{t.name}-v{i}", t.shape, t.created, t.deleted))
    return out


def model_constraints(
    tasks: Sequence[Task], nodes: Sequence[NodeSpec], fraction: float = 0.33, seed: int = 0
) -> List[Task]:
    """`fraction` of the GPU tasks accept only one or two GPU models, drawn by the cluster's GPUs of each
    model that could ever hold the task."""
    rng = random.Random(seed)
    gpus_by_model: Dict[str, int] = {}
    largest: Dict[str, int] = {}
    for n in nodes:
        if n.gpus and n.model:
            gpus_by_model[n.model] = gpus_by_model.get(n.model, 0) + n.gpus
            largest[n.model] = max(largest.get(n.model, 0), n.gpus)
    out = []
    for t in tasks:
        s = t.shape
        if s.gpus and rng.random() < fraction:
            models = [m for m in gpus_by_model if largest[m] >= s.gpus]
            if models:
                weights = [gpus_by_model[m] for m in models]
                picked = {rng.choices(models, weights)[0] for _ in range(rng.choice((1, 2)))}
                s = TaskShape(s.gpus, s.milli, s.cpu_milli, s.memory_mib, tuple(sorted(picked)))
        out.append(Task(t.name, s, t.created, t.deleted))
    return out
