"""The replay loop: tasks arrive, a policy chooses a node and GPUs, the cluster fills; no I/O.

Arrival mode (the FGD paper's method): the workload in a shuffled order, then tasks drawn from it
at random with replacement until the GPUs asked for reach `arrive` times the cluster's; no task
leaves. Timeline mode: tasks arrive at their creation time and leave at their deletion time.
A task that fits nowhere fails and is not retried.

Scores are memoised per (node state, task shape): a task changes one node, so most nodes'
scores are reused by the next task of the same shape.
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..core.fragmentation import MILLI, Fragmentation, NodeFree, TaskShape
from ..core.nodescore import Evaluation
from .policies import ReplayPolicy, typical_mix
from .trace import NodeSpec, Task

NodeKey = Tuple[str, Tuple[int, ...], Optional[int], Optional[int]]
Progress = Callable[[int, int], None]


def arrival_order(tasks: Sequence[Task], capacity_milli: int, arrive: float, seed: int) -> List[Task]:
    """The paper's arrival: all tasks shuffled, then random draws (with replacement) until the GPUs
    asked for would pass `arrive` x capacity; below the workload's own total, random tasks are dropped."""
    rng = random.Random(seed)
    order = sorted(tasks, key=lambda t: t.name)
    rng.shuffle(order)
    target = arrive * capacity_milli
    total = sum(t.shape.total_milli for t in order)
    while total > target and order:
        total -= order.pop(rng.randrange(len(order))).shape.total_milli
    gpu_tasks = [t for t in tasks if t.shape.gpus]
    if not gpu_tasks:
        return order
    drawn = 0
    while True:
        t = tasks[rng.randrange(len(tasks))]
        if total + t.shape.total_milli > target:
            break
        total += t.shape.total_milli
        drawn += 1
        order.append(Task(f"{t.name}-draw-{drawn}", t.shape, t.created, t.deleted))
    return order


@dataclass
class Result:
    """What a replay measured. GPU figures are in thousandths of a GPU unless named percent."""

    policy: str
    mode: str
    seed: int
    arrive: float
    nodes: int
    gpus: int
    tasks: int = 0
    placed: int = 0
    failed: int = 0
    failed_gpu_tasks: int = 0
    allocated_milli: int = 0
    first_failure_arrival_percent: Optional[float] = None
    fragmentation_percent: float = 0.0
    seconds: float = 0.0
    # (arrived GPU % of capacity, allocated GPU % of capacity), one point per whole arrival percent
    curve: List[Tuple[float, float]] = field(default_factory=list)

    @property
    def unallocated_gpu_percent(self) -> float:
        return 100.0 * (1.0 - self.allocated_milli / (self.gpus * MILLI)) if self.gpus else 0.0

    def to_dict(self) -> Dict[str, object]:
        return {
            "policy": self.policy,
            "mode": self.mode,
            "seed": self.seed,
            "arrive": self.arrive,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "tasks": self.tasks,
            "placed": self.placed,
            "failed": self.failed,
            "failed_gpu_tasks": self.failed_gpu_tasks,
            "unallocated_gpu_percent": round(self.unallocated_gpu_percent, 3),
            "allocated_gpus": round(self.allocated_milli / MILLI, 3),
            "fragmentation_percent": round(self.fragmentation_percent, 3),
            "first_failure_arrival_percent": self.first_failure_arrival_percent,
            "seconds": round(self.seconds, 3),
            "curve": [[round(a, 2), round(b, 3)] for a, b in self.curve],
        }


class Cluster:
    """The nodes' free resources, and per (state, shape) memoised scores of one policy."""

    def __init__(self, nodes: Sequence[NodeSpec], policy: ReplayPolicy) -> None:
        self.specs = sorted(nodes, key=lambda n: n.name)  # "first of ties" means first by name
        self.policy = policy
        self.gpus: List[List[int]] = []
        self.cpu: List[Optional[int]] = []
        self.mem: List[Optional[int]] = []
        self.model: List[str] = []
        for n in self.specs:
            free = n.free()
            self.gpus.append(list(free.gpus))
            self.cpu.append(free.cpu_milli)
            self.mem.append(free.memory_mib)
            self.model.append(free.model)
        self.keys: List[NodeKey] = [self._key(i) for i in range(len(self.specs))]
        self.capacity_milli = MILLI * sum(len(g) for g in self.gpus)
        self._scores: Dict[TaskShape, Dict[NodeKey, float]] = {}
        self._evaluations: Dict[Tuple[TaskShape, NodeKey], Optional[Evaluation]] = {}
        self._version = policy.version

    def _key(self, i: int) -> NodeKey:
        return (self.model[i], tuple(self.gpus[i]), self.cpu[i], self.mem[i])

    def node(self, i: int) -> NodeFree:
        return NodeFree(tuple(self.gpus[i]), self.cpu[i], self.mem[i], self.model[i])

    @property
    def allocated_milli(self) -> int:
        return self.capacity_milli - sum(sum(g) for g in self.gpus)

    def choose(self, task: TaskShape, rng: random.Random) -> Optional[Tuple[int, Tuple[int, ...]]]:
        """The node (index) and GPUs the policy gives `task`, or None when no node holds it."""
        policy = self.policy
        if policy.version != self._version:
            self._scores.clear()
            self._evaluations.clear()
            self._version = policy.version
        scores = self._scores.get(task)
        if scores is None:
            scores = self._scores[task] = {}
        keys = self.keys
        found = list(map(scores.get, keys))
        if None in found:
            for i, v in enumerate(found):
                if v is None:
                    key = keys[i]
                    cached = scores.get(key)
                    if cached is None:
                        evaluation = policy.evaluate(self.node(i), task)
                        cached = scores[key] = float("-inf") if evaluation is None else evaluation.score
                        self._evaluations[(task, key)] = evaluation
                    found[i] = cached
        values: List[float] = found  # type: ignore[assignment]  # every None was filled above
        best = max(values) if values else float("-inf")
        if best == float("-inf"):
            return None
        if policy.random_node:
            ties = [i for i, v in enumerate(values) if v != float("-inf")]
        else:
            floor = best - policy.tolerance
            ties = [i for i, v in enumerate(values) if v >= floor]
        i = ties[0] if len(ties) == 1 or policy.first_of_ties else rng.choice(ties)
        evaluation = self._evaluations[(task, keys[i])]
        assert evaluation is not None
        return i, policy.picks(self.node(i), task, evaluation, rng)

    def take(self, i: int, task: TaskShape, picks: Sequence[int]) -> None:
        gpus = self.gpus[i]
        for g in picks:
            gpus[g] -= task.milli
        cpu, mem = self.cpu[i], self.mem[i]
        if cpu is not None:
            self.cpu[i] = cpu - task.cpu_milli
        if mem is not None:
            self.mem[i] = mem - task.memory_mib
        self.keys[i] = self._key(i)

    def give_back(self, i: int, task: TaskShape, picks: Sequence[int]) -> None:
        gpus = self.gpus[i]
        for g in picks:
            gpus[g] += task.milli
        cpu, mem = self.cpu[i], self.mem[i]
        if cpu is not None:
            self.cpu[i] = cpu + task.cpu_milli
        if mem is not None:
            self.mem[i] = mem + task.memory_mib
        self.keys[i] = self._key(i)

    def fragmentation_milli(self, frag: Fragmentation) -> float:
        return sum(frag.of(self.node(i)) for i in range(len(self.gpus)))


def replay_arrival(
    nodes: Sequence[NodeSpec],
    tasks: Sequence[Task],
    policy: ReplayPolicy,
    arrive: float = 1.3,
    seed: int = 1,
    progress: Optional[Progress] = None,
) -> Result:
    """Replay `tasks` with the paper's arrival method (see `arrival_order`)."""
    started = time.perf_counter()
    cluster = Cluster(nodes, policy)
    order = arrival_order(tasks, cluster.capacity_milli, arrive, seed)
    rng = random.Random(seed)
    result = Result(policy.name, "arrival", seed, arrive, len(nodes), cluster.capacity_milli // MILLI, len(order))
    arrived = allocated = 0
    result.curve.append((0.0, 0.0))
    next_point = 1
    for n, task in enumerate(order):
        shape = task.shape
        policy.observe(shape)
        arrived += shape.total_milli
        chosen = cluster.choose(shape, rng)
        if chosen is None:
            result.failed += 1
            if shape.gpus:
                result.failed_gpu_tasks += 1
            if result.first_failure_arrival_percent is None:
                result.first_failure_arrival_percent = round(100.0 * arrived / cluster.capacity_milli, 2)
        else:
            cluster.take(chosen[0], shape, chosen[1])
            allocated += shape.total_milli
            result.placed += 1
        while 100.0 * arrived / cluster.capacity_milli >= next_point:
            result.curve.append((float(next_point), 100.0 * allocated / cluster.capacity_milli))
            next_point += 1
        if progress is not None and n % 256 == 0:
            progress(n, len(order))
    if result.curve[-1][0] < 100.0 * arrived / cluster.capacity_milli:
        result.curve.append((100.0 * arrived / cluster.capacity_milli, 100.0 * allocated / cluster.capacity_milli))
    result.allocated_milli = cluster.allocated_milli
    result.fragmentation_percent = _fragmentation_percent(cluster, tasks)
    result.seconds = time.perf_counter() - started
    if progress is not None:
        progress(len(order), len(order))
    return result


def replay_timeline(
    nodes: Sequence[NodeSpec],
    tasks: Sequence[Task],
    policy: ReplayPolicy,
    seed: int = 1,
    progress: Optional[Progress] = None,
) -> Result:
    """Replay `tasks` in creation order; each leaves at its deletion time (never, without one).

    `allocated_milli` (so the unallocated share) is taken at the peak of allocation; the curve is
    allocation against the GPUs asked for so far, every half percent.
    """
    started = time.perf_counter()
    cluster = Cluster(nodes, policy)
    rng = random.Random(seed)
    order = sorted(tasks, key=lambda t: (t.created, t.name))
    result = Result(policy.name, "timeline", seed, 0.0, len(nodes), cluster.capacity_milli // MILLI, len(order))
    running: List[Tuple[float, int, int, TaskShape, Tuple[int, ...]]] = []
    arrived = 0
    next_point = 0.0
    for n, task in enumerate(order):
        while running and running[0][0] <= task.created:
            _, _, i, shape, picks = heapq.heappop(running)
            cluster.give_back(i, shape, picks)
        policy.observe(task.shape)
        arrived += task.shape.total_milli
        chosen = cluster.choose(task.shape, rng)
        if chosen is None:
            result.failed += 1
            if task.shape.gpus:
                result.failed_gpu_tasks += 1
            if result.first_failure_arrival_percent is None:
                result.first_failure_arrival_percent = round(100.0 * arrived / cluster.capacity_milli, 2)
            continue
        cluster.take(chosen[0], task.shape, chosen[1])
        result.placed += 1
        if task.deleted is not None and task.deleted > task.created:
            heapq.heappush(running, (task.deleted, n, chosen[0], task.shape, chosen[1]))
        allocated = cluster.allocated_milli
        # the busiest moment is what sizes a cluster: report the allocation there
        result.allocated_milli = max(result.allocated_milli, allocated)
        if 100.0 * arrived / cluster.capacity_milli >= next_point:
            result.curve.append((100.0 * arrived / cluster.capacity_milli, 100.0 * allocated / cluster.capacity_milli))
            next_point += 0.5
        if progress is not None and n % 256 == 0:
            progress(n, len(order))
    result.fragmentation_percent = _fragmentation_percent(cluster, tasks)
    result.seconds = time.perf_counter() - started
    if progress is not None:
        progress(len(order), len(order))
    return result


def _fragmentation_percent(cluster: Cluster, tasks: Sequence[Task]) -> float:
    """Free GPU that the workload's typical task could not use, as % of all GPUs (FGD's measure, one yardstick for every policy)."""
    frag = Fragmentation(typical_mix([t.shape for t in tasks]), memory=False)
    return 100.0 * cluster.fragmentation_milli(frag) / cluster.capacity_milli if cluster.capacity_milli else 0.0
