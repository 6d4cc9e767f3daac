"""Node scores for a task, as the scheduler extender and the simulator rank nodes: FGD's, gpupool's
fragmentation-aware score and binpack/spread fullness, with the tuning they share.

Split from core/fragmentation.py (the fragmentation measure, the learned mix and the pool's
device choice), which every claim on the embedded pool imports: a `gpupool run` never ranks nodes,
so it does not load these classes (issue 24).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .fragmentation import MILLI, Fragmentation, NodeFree, TaskShape

if TYPE_CHECKING:
    from typing import List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Evaluation:
    """A node's score for a task (higher is better) and the GPUs (indices) the task would take there."""

    score: float
    picks: Tuple[int, ...]


def _fitting(node: NodeFree, milli: int) -> List[int]:
    return [i for i, g in enumerate(node.gpus) if g >= milli]


def _packed(node: NodeFree, task: TaskShape) -> Tuple[int, ...]:
    """The task's GPUs by best fit: the fullest GPUs that still hold its share."""
    fitting = sorted(_fitting(node, task.milli), key=lambda i: (node.gpus[i], i))
    return tuple(sorted(fitting[: task.gpus]))


def fgd_evaluate(node: NodeFree, task: TaskShape, frag: Fragmentation) -> Optional[Evaluation]:
    """FGD as the paper's simulator scores it: 0..100, sigmoid of the fragmentation decrease, truncated.

    A shared GPU goes to the GPU with the best (quantised) score, the first in index order among
    equals; whole GPUs are taken fully free, first ones first. CPU counts, memory does not.
    """
    if not node.holds(task):
        return None
    before = frag.of(node)
    if task.gpus == 1 and task.milli < MILLI:
        best: Optional[Evaluation] = None
        for i in _fitting(node, task.milli):
            score = _sigmoid_score(before - frag.of(node.minus(task, (i,))))
            if best is None or score > best.score:
                best = Evaluation(score, (i,))
        return best
    picks = _packed(node, task) if task.gpus else ()
    return Evaluation(_sigmoid_score(before - frag.of(node.minus(task, picks))), picks)


def _sigmoid_score(decrease: float) -> float:
    return float(int(100.0 / (1.0 + math.exp(-decrease / MILLI))))


@dataclass(frozen=True)
class FragAwareTuning:
    """The knobs of `fragaware_evaluate` and `choose_node` (defaults measured on the openb trace).

    Attributes:
        stranding: weight of the GPU share a node's CPU or memory can no longer feed (see
            `Fragmentation.stranded`), added to the fragmentation growth.
        cpu_only: for a task without GPUs, the cost per thousandth of a GPU left free on the node
            (such tasks belong where the GPUs are taken, not where they take a GPU task's CPU).
        tolerance: placements within this much (thousandths of a GPU) of the best count as equally
            good; among them the first node in a fixed order wins (first fit). 0: exact ties only
            (measured on openb: 35 and 0 strand the same, so the default keeps the score exact).
    """

    stranding: float = 1.0
    cpu_only: float = 1.0
    tolerance: float = 0.0


DEFAULT_TUNING = FragAwareTuning()


def fragaware_evaluate(
    node: NodeFree, task: TaskShape, frag: Fragmentation, tuning: FragAwareTuning = DEFAULT_TUNING
) -> Optional[Evaluation]:
    """gpupool's policy: the score is minus the growth of expected fragmentation plus stranding.

    Growth = (fragmentation after - before) + stranding x (stranded GPU after - before), in
    thousandths of a GPU, exact. A shared task takes the GPU where that is least (the fullest
    among equals); a CPU-only task also pays for the GPU it leaves free on the node.
    """
    if not node.holds(task):
        return None
    before = frag.of(node) + tuning.stranding * frag.stranded(node)
    if task.gpus == 0:
        after_node = node.minus(task, ())
        growth = frag.of(after_node) + tuning.stranding * frag.stranded(after_node) - before
        return Evaluation(-growth - tuning.cpu_only * after_node.free_milli, ())
    if task.gpus == 1:
        best: Optional[Evaluation] = None
        seen = set()
        for i in _fitting(node, task.milli):
            if node.gpus[i] in seen:  # GPUs with the same free share are interchangeable
                continue
            seen.add(node.gpus[i])
            after_node = node.minus(task, (i,))
            growth = frag.of(after_node) + tuning.stranding * frag.stranded(after_node) - before
            # among equal growth, the GPU that ends up fullest (best fit)
            score = -growth - (node.gpus[i] - task.milli) / 1e6
            if best is None or score > best.score:
                best = Evaluation(score, (i,))
        return best
    picks = _greedy_picks(node, task, frag)
    after_node = node.minus(task, picks)
    growth = frag.of(after_node) + tuning.stranding * frag.stranded(after_node) - before
    return Evaluation(-growth, picks)


def choose_node(scores: Sequence[Optional[float]], tolerance: float = DEFAULT_TUNING.tolerance) -> Optional[int]:
    """The index of the winning node: the first whose score is within `tolerance` of the best (None: none fits).

    `scores` are in a fixed node order (by name), so near-ties always go the same way: first fit.
    """
    best = max((x for x in scores if x is not None), default=None)
    if best is None:
        return None
    floor = best - tolerance
    return next(i for i, x in enumerate(scores) if x is not None and x >= floor)


def rank_scores(
    scores: Sequence[Optional[float]], tolerance: float = DEFAULT_TUNING.tolerance, top: int = 10
) -> List[int]:
    """Scores as 0..`top` integers (a scheduler extender's range) that keep `choose_node`'s winner alone on top.

    The winner gets `top`; the rest get `top - 1` down to 1 by their score's rank, and nodes
    that cannot hold the task 0; the scheduler then picks what `choose_node` would.
    """
    winner = choose_node(scores, tolerance)
    distinct = sorted({x for x in scores if x is not None}, reverse=True)
    rank = {x: r for r, x in enumerate(distinct)}
    spread = max(1, len(distinct))
    out: List[int] = []
    for i, x in enumerate(scores):
        if x is None:
            out.append(0)
        elif i == winner:
            out.append(top)
        else:
            out.append(max(1, top - 1 - (rank[x] * (top - 1)) // spread))
    return out


def _greedy_picks(node: NodeFree, task: TaskShape, frag: Fragmentation) -> Tuple[int, ...]:
    """GPUs for a multi-GPU task, one at a time, each where the fragmentation grows least."""
    if task.milli == MILLI:
        return tuple(i for i, g in enumerate(node.gpus) if g >= MILLI)[: task.gpus]
    picks: List[int] = []
    current = node
    one = TaskShape(1, task.milli)
    for _ in range(task.gpus):
        candidates = [i for i in _fitting(current, task.milli) if i not in picks]
        best = min(candidates, key=lambda i: (frag.of(current.minus(one, (i,))), current.gpus[i], i))
        picks.append(best)
        current = current.minus(one, (best,))
    return tuple(sorted(picks))


def fullness_score(node: NodeFree, task: TaskShape, spread: bool = False) -> Optional[Evaluation]:
    """The scheduler extender's binpack/spread score, 0..10: how full (or empty) the node's GPUs are after.

    GPUs are chosen as `core.placement.place` does: binpack the fullest GPU that holds the share,
    spread the emptiest.
    """
    if not node.holds(task):
        return None
    fitting = _fitting(node, task.milli) if task.gpus else []
    if spread:
        fitting.sort(key=lambda i: (-node.gpus[i], i))
    else:
        fitting.sort(key=lambda i: (node.gpus[i] - task.milli, i))
    picks = tuple(sorted(fitting[: task.gpus]))
    capacity = MILLI * len(node.gpus) or 1
    used = capacity - node.free_milli + task.total_milli
    full = min(1.0, used / capacity)
    share = 1.0 - full if spread else full
    return Evaluation(float(math.floor(share * 10 + 1e-9)), picks)


__all__ = [
    "Evaluation",
    "fgd_evaluate",
    "fragaware_evaluate",
    "choose_node",
    "rank_scores",
    "FragAwareTuning",
    "DEFAULT_TUNING",
    "fullness_score",
]
