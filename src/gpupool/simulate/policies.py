"""The placement policies a replay can run, each a thin face over `core` scoring and `place()`.

A policy scores a node state for a task (None: it does not fit) and names the GPUs the task
takes there. Scores are what the scheduler sees: the node with the highest wins, ties are
broken at random (as kube-scheduler does), so coarse scores (binpack's 0..10, FGD's 0..100)
behave in the replay as they do in a cluster.
"""

from __future__ import annotations

import random
from typing import Dict, List, Optional, Sequence, Tuple

from ..core.errors import InvalidInput
from ..core.fragmentation import MILLI, Fragmentation, LearnedMix, NodeFree, ShapeMix, TaskShape
from ..core.model import Claim, Device, Policy
from ..core.nodescore import (
    DEFAULT_TUNING,
    Evaluation,
    FragAwareTuning,
    fgd_evaluate,
    fragaware_evaluate,
    fullness_score,
)
from ..core.placement import place

DEFAULT_POLICY = "fragaware"


class ReplayPolicy:
    """Base: score a node for a task; `version` changes whenever earlier scores go stale."""

    name = ""
    random_node = False  # pick any node that fits, at random
    first_of_ties = False  # among equal scores the first node by name (the paper's simulator), else at random
    tolerance = 0.0  # scores within this much of the best count as equal
    version = 0

    def evaluate(self, node: NodeFree, task: TaskShape) -> Optional[Evaluation]:
        raise NotImplementedError

    def observe(self, task: TaskShape) -> None:
        """A task arrived (before it is placed): policies that learn the workload count it."""

    def picks(self, node: NodeFree, task: TaskShape, evaluation: Evaluation, rng: random.Random) -> Tuple[int, ...]:
        """The GPUs the task takes on the chosen node."""
        return evaluation.picks


class Fullness(ReplayPolicy):
    """binpack / spread: the extender's 0..10 node score, GPUs chosen by `core.placement.place`."""

    def __init__(self, spread: bool) -> None:
        self.name = "spread" if spread else "binpack"
        self.spread = spread
        self.policy = Policy.SPREAD if spread else Policy.BINPACK

    def evaluate(self, node: NodeFree, task: TaskShape) -> Optional[Evaluation]:
        return fullness_score(node, task, spread=self.spread)

    def picks(self, node: NodeFree, task: TaskShape, evaluation: Evaluation, rng: random.Random) -> Tuple[int, ...]:
        if task.gpus == 0:
            return ()
        return place_on_node(node, task, self.policy)


def place_on_node(node: NodeFree, task: TaskShape, policy: Policy) -> Tuple[int, ...]:
    """The GPUs `core.placement.place` gives `task` on this node (a GPU of 1000 'MiB' per thousandth)."""
    devices = [Device(f"g{i}", i, node.model, MILLI, "n") for i in range(len(node.gpus))]
    allocated = {d.uuid: MILLI - node.gpus[d.index] for d in devices}
    claim = Claim.single(task.gpus, fraction=task.milli / MILLI, policy=policy)
    placed = place(devices, allocated, claim)
    if placed.slices is None:  # pragma: no cover - evaluate() said it fits
        raise AssertionError(f"place() refused {task} on {node}: {placed.reason}")
    return tuple(sorted(int(s.device_uuid[1:]) for s in placed.slices))


class RandomFit(ReplayPolicy):
    """Any node that fits, at random; a shared task on a random GPU that holds it (the paper's random fit)."""

    name = "random"
    random_node = True

    def evaluate(self, node: NodeFree, task: TaskShape) -> Optional[Evaluation]:
        return Evaluation(0.0, ()) if node.holds(task) else None

    def picks(self, node: NodeFree, task: TaskShape, evaluation: Evaluation, rng: random.Random) -> Tuple[int, ...]:
        fitting = [i for i, g in enumerate(node.gpus) if g >= task.milli] if task.gpus else []
        if task.gpus == 1 and task.milli < MILLI:
            return (rng.choice(fitting),)
        return tuple(sorted(fitting[: task.gpus]))


def typical_mix(tasks: Sequence[TaskShape], popularity: float = 0.95, step: int = 1) -> ShapeMix:
    """FGD's "typical pods": shapes by (CPU, GPU share, GPU count, model), most frequent first, taken
    `step` at a time until they cover `popularity` of the tasks, renormalised. Memory is not part of it."""
    counts: Dict[TaskShape, float] = {}
    for t in tasks:
        key = TaskShape(t.gpus, t.milli, max(t.cpu_milli, 100), 0, t.models)  # 100m: Kubernetes' non-zero default
        counts[key] = counts.get(key, 0.0) + 1.0
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    total = sum(counts.values())
    kept: List[Tuple[TaskShape, float]] = []
    covered = 0.0
    while covered < popularity * total and len(kept) < len(ordered):
        for shape, count in ordered[len(kept) : len(kept) + step]:
            kept.append((shape, count))
            covered += count
    return ShapeMix(kept)


class FGD(ReplayPolicy):
    """The paper's FGD: typical shapes of the whole workload, known in advance; CPU counted, memory not."""

    name = "fgd"
    first_of_ties = True  # its selectHost keeps the smallest node name among equal scores

    def __init__(self, workload: Sequence[TaskShape]) -> None:
        self.frag = Fragmentation(typical_mix(workload), memory=False)

    def evaluate(self, node: NodeFree, task: TaskShape) -> Optional[Evaluation]:
        return fgd_evaluate(node, task, self.frag)


class FragAware(ReplayPolicy):
    """gpupool's policy: learns the mix from the tasks it sees (`core.fragmentation.LearnedMix`, as the pool does)."""

    name = DEFAULT_POLICY

    def __init__(self, half_life: float = 5000.0, tuning: FragAwareTuning = DEFAULT_TUNING) -> None:
        self.learned = LearnedMix(half_life)
        self.tuning = tuning
        self.tolerance = tuning.tolerance
        self.first_of_ties = tuning.tolerance > 0  # near-ties go by node order, as `choose_node` does
        self.version = self.learned.version

    def observe(self, task: TaskShape) -> None:
        self.learned.observe(task)
        self.version = self.learned.version

    def evaluate(self, node: NodeFree, task: TaskShape) -> Optional[Evaluation]:
        return fragaware_evaluate(node, task, self.learned.frag, self.tuning)


POLICIES = (DEFAULT_POLICY, "fgd", "binpack", "spread", "random")


def make_policy(name: str, workload: Sequence[TaskShape]) -> ReplayPolicy:
    """The replay policy called `name` (see POLICIES); `workload` is what FGD is told in advance."""
    if name == "binpack":
        return Fullness(spread=False)
    if name == "spread":
        return Fullness(spread=True)
    if name == "random":
        return RandomFit()
    if name == "fgd":
        return FGD(workload)
    if name == DEFAULT_POLICY:
        return FragAware()
    raise InvalidInput(f"policy {name!r} is unknown: use one of {', '.join(POLICIES)}")
