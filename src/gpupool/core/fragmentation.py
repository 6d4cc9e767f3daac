"""Fragmentation-aware placement: how much GPU a placement strands, against the mix of task shapes seen.

A node's fragmentation against one task shape is the GPU share it holds free that such a task
could not use: all of it when the task cannot run there at all (too few GPUs with room, not
enough CPU or memory, another GPU model), else the free share of the GPUs too full to hold one
of its GPUs. Against a mix of shapes it is the expectation over the mix. FGD (Weng et al.,
"Beware of Fragmentation", USENIX ATC '23) places each task where that expectation grows least.

`core/nodescore.py` holds the node scores built on this measure: `fgd_evaluate` is FGD as the paper's simulator scores it (the baseline). `fragaware_evaluate` is
gpupool's policy: the same gradient, but exact instead of quantised to 100 levels, counting
memory as well as CPU, adding the GPU share a node's free CPU or memory can no longer feed
(`Fragmentation.stranded`), sending tasks without GPUs where the GPUs are taken, and breaking
ties by best fit. Its mix comes from a decaying histogram of the claims seen (`LearnedMix`),
not a fixed file, each shape weighted by the GPU it asks for (a stranded 8-GPU task leaves
more idle than a stranded tenth of one).

Pure: no I/O, no clock. GPU shares are in thousandths of a GPU ("milli", 1000 = a whole GPU).
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from .errors import InvalidInput
from .model import Device, GpuRequest

if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

MILLI = 1000
MEMO_LIMIT = 500_000  # node states remembered per mix (about 100 MB at most)
_SERIALS = itertools.count(1)


@dataclass(frozen=True)
class TaskShape:
    """What one task asks of a node: N GPUs at a share each, CPU, memory, accepted GPU models."""

    gpus: int = 0
    milli: int = 0  # share of each GPU, 1..1000 when gpus > 0, else 0
    cpu_milli: int = 0
    memory_mib: int = 0
    models: Tuple[str, ...] = ()  # accepted GPU models; empty: any

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.cpu_milli < 0 or self.memory_mib < 0:
            raise InvalidInput(f"task shape {self} has a negative amount: GPUs, CPU and memory are >= 0")
        if self.gpus > 0 and not (0 < self.milli <= MILLI):
            raise InvalidInput(f"task shape {self}: a GPU share is 1..1000 thousandths of a GPU")
        if self.gpus == 0 and self.milli != 0:
            raise InvalidInput(f"task shape {self}: a share without GPUs; set gpus >= 1 or milli = 0")

    @property
    def total_milli(self) -> int:
        """The GPU it asks for in all, in thousandths of a GPU."""
        return self.gpus * self.milli

    def accepts(self, model: str) -> bool:
        """Whether a GPU of `model` may serve this task."""
        return not self.models or model in self.models

    def to_dict(self) -> Dict[str, Any]:
        return {
            "gpus": self.gpus,
            "milli": self.milli,
            "cpu_milli": self.cpu_milli,
            "memory_mib": self.memory_mib,
            "models": list(self.models),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskShape:
        return cls(
            gpus=int(data.get("gpus", 0)),
            milli=int(data.get("milli", 0)),
            cpu_milli=int(data.get("cpu_milli", 0)),
            memory_mib=int(data.get("memory_mib", 0)),
            models=tuple(str(m) for m in data.get("models") or ()),
        )


class NodeFree(NamedTuple):
    """What a node has free: per-GPU share, and CPU and memory where the node reports them (None: not counted)."""

    gpus: Tuple[int, ...]
    cpu_milli: Optional[int] = None
    memory_mib: Optional[int] = None
    model: str = ""

    @property
    def free_milli(self) -> int:
        return sum(self.gpus)

    def holds(self, task: TaskShape) -> bool:
        """Whether `task` fits here now: model, CPU, memory, and enough GPUs with its share free."""
        if self.cpu_milli is not None and task.cpu_milli > self.cpu_milli:
            return False
        if self.memory_mib is not None and task.memory_mib > self.memory_mib:
            return False
        if task.gpus == 0:
            return True
        if not task.accepts(self.model):
            return False
        need = task.milli
        return sum(1 for g in self.gpus if g >= need) >= task.gpus

    def minus(self, task: TaskShape, picks: Sequence[int]) -> NodeFree:
        """This node after `task` took its share of each GPU in `picks` (indices), its CPU and memory."""
        gpus = list(self.gpus)
        for i in picks:
            gpus[i] -= task.milli
        return NodeFree(
            tuple(gpus),
            None if self.cpu_milli is None else self.cpu_milli - task.cpu_milli,
            None if self.memory_mib is None else self.memory_mib - task.memory_mib,
            self.model,
        )


class ShapeMix:
    """A normalised distribution of task shapes, with what fragmentation needs precomputed."""

    def __init__(self, weighted: Iterable[Tuple[TaskShape, float]]) -> None:
        merged: Dict[TaskShape, float] = {}
        for shape, weight in weighted:
            if weight > 0:
                merged[shape] = merged.get(shape, 0.0) + weight
        total = sum(merged.values())
        ordered = sorted(merged.items(), key=lambda sw: (-sw[1], _shape_order(sw[0])))
        self.shapes: Tuple[Tuple[TaskShape, float], ...] = tuple((s, w / total) for s, w in ordered) if total else ()
        # CPU and memory matter to fragmentation only through these thresholds.
        self.cpu_levels: List[int] = sorted({s.cpu_milli for s, _ in self.shapes})
        self.memory_levels: List[int] = sorted({s.memory_mib for s, _ in self.shapes})

    def __len__(self) -> int:
        return len(self.shapes)

    def top(self, coverage: float = 1.0, limit: int = 0) -> ShapeMix:
        """The most frequent shapes that together make `coverage` of the mix (at most `limit`), renormalised."""
        kept: List[Tuple[TaskShape, float]] = []
        covered = 0.0
        for shape, p in self.shapes:
            if covered >= coverage - 1e-12 or (limit and len(kept) >= limit):
                break
            kept.append((shape, p))
            covered += p
        return ShapeMix(kept)

    def reweighted(self, gpu_weight: float) -> ShapeMix:
        """The mix with each shape's weight times (1 + gpu_weight * GPUs it asks for): big tasks count more."""
        return ShapeMix((s, p * (1.0 + gpu_weight * s.total_milli / MILLI)) for s, p in self.shapes)

    def to_list(self) -> List[Dict[str, Any]]:
        return [dict(s.to_dict(), p=p) for s, p in self.shapes]

    @classmethod
    def from_counts(cls, counts: Mapping[TaskShape, float]) -> ShapeMix:
        return cls(counts.items())


def _shape_order(s: TaskShape) -> Tuple[int, int, int, int, Tuple[str, ...]]:
    return (s.gpus, s.milli, s.cpu_milli, s.memory_mib, s.models)


class ShapeHistogram:
    """A decaying count of the task shapes a pool has seen: recent claims weigh more.

    Each observation adds 1; older ones decay by half every `half_life` observations. The
    state is a plain dict (`to_dict`/`from_dict`) so the pool can persist it.
    """

    def __init__(self, half_life: float = 5000.0, counts: Optional[Mapping[TaskShape, float]] = None) -> None:
        if half_life <= 0:
            raise InvalidInput(f"half_life {half_life!r} must be > 0 (observations)")
        self.half_life = float(half_life)
        self._decay = 0.5 ** (1.0 / self.half_life)
        self._scale = 1.0  # counts are stored multiplied by this, so decay costs nothing per observation
        self._counts: Dict[TaskShape, float] = dict(counts or {})
        self.observed = 0

    def observe(self, shape: TaskShape, weight: float = 1.0) -> None:
        """Count one claim of `shape`."""
        self._scale /= self._decay
        if self._scale > 1e100:  # fold the scale back in before it overflows
            self._counts = {s: c / self._scale for s, c in self._counts.items()}
            self._scale = 1.0
        self._counts[shape] = self._counts.get(shape, 0.0) + weight * self._scale
        self.observed += 1

    def counts(self) -> Dict[TaskShape, float]:
        """The decayed count of each shape (a newest observation counts 1)."""
        return {s: c / self._scale for s, c in self._counts.items() if c / self._scale > 1e-9}

    def mix(self, coverage: float = 0.99, limit: int = 64) -> ShapeMix:
        """The current mix: the most frequent shapes covering `coverage` of the weight, at most `limit`."""
        return ShapeMix.from_counts(self.counts()).top(coverage, limit)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "half_life": self.half_life,
            "observed": self.observed,
            "shapes": [dict(s.to_dict(), count=c) for s, c in sorted(self.counts().items(), key=lambda sc: -sc[1])],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShapeHistogram:
        counts = {TaskShape.from_dict(d): float(d.get("count", 0.0)) for d in data.get("shapes") or ()}
        hist = cls(float(data.get("half_life", 5000.0)), counts)
        hist.observed = int(data.get("observed", 0))
        return hist


class Fragmentation:
    """Expected fragmentation of node states against one mix, memoised per state (states recur a lot).

    Args:
        mix: the task shapes to expect.
        memory: count memory when deciding whether a shape can run (FGD counts CPU only).
        gpu_only: leave CPU-only shapes out (they need no GPU, so they cannot strand one).
    """

    def __init__(self, mix: ShapeMix, memory: bool = True, gpu_only: bool = False) -> None:
        self.mix = mix
        self.memory = memory
        shapes = [(s, p) for s, p in mix.shapes if not (gpu_only and s.gpus == 0)]
        self._cpu_levels = sorted({s.cpu_milli for s, _ in shapes})
        self._mem_levels = sorted({s.memory_mib for s, _ in shapes}) if memory else []
        # each shape with the level a node needs to hold its CPU and memory (see `of`)
        self._shapes = [
            (
                s.gpus,
                s.milli,
                bisect.bisect_right(self._cpu_levels, s.cpu_milli),
                bisect.bisect_right(self._mem_levels, s.memory_mib) if memory else 0,
                frozenset(s.models),
                p,
            )
            for s, p in shapes
        ]
        self._memo: Dict[Tuple[Any, ...], float] = {}
        self.serial = next(_SERIALS)  # names this measure in caches kept elsewhere (ints: no GC tracking)
        # what the mix's GPU tasks ask per thousandth of a GPU: CPU milli, memory MiB
        gpu_shapes = [(s, p) for s, p in shapes if s.gpus]
        demand = sum(p * s.total_milli for s, p in gpu_shapes)
        self.cpu_per_milli = sum(p * s.cpu_milli for s, p in gpu_shapes) / demand if demand else 0.0
        self.memory_per_milli = sum(p * s.memory_mib for s, p in gpu_shapes) / demand if demand and memory else 0.0

    def stranded(self, node: NodeFree) -> float:
        """Free GPU share (milli) the node's free CPU or memory cannot feed at the mix's usual ratio."""
        free = node.free_milli
        fed = float(free)
        if node.cpu_milli is not None and self.cpu_per_milli > 0:
            fed = min(fed, node.cpu_milli / self.cpu_per_milli)
        if node.memory_mib is not None and self.memory_per_milli > 0:
            fed = min(fed, node.memory_mib / self.memory_per_milli)
        return max(0.0, free - fed)

    def of(self, node: NodeFree) -> float:
        """Expected free GPU share (milli) that the next task of the mix could not use."""
        # CPU and memory change the answer only when they cross a shape's demand: key on the level.
        cpu = -1 if node.cpu_milli is None else bisect.bisect_right(self._cpu_levels, node.cpu_milli)
        mem = (
            -1 if node.memory_mib is None or not self.memory else bisect.bisect_right(self._mem_levels, node.memory_mib)
        )
        gpus = tuple(sorted(node.gpus))
        key = (node.model, gpus, cpu, mem)
        value = self._memo.get(key)
        if value is None:
            if len(self._memo) >= MEMO_LIMIT:  # a long-lived extender sees endless states: start over
                self._memo.clear()
            value = self._memo[key] = self._compute(node.model, gpus, cpu, mem)
        return value

    def _compute(self, model: str, gpus: Tuple[int, ...], cpu_level: int, mem_level: int) -> float:
        total = sum(gpus)
        if total == 0:
            return 0.0
        frag = 0.0
        for count, milli, cpu_need, mem_need, models, p in self._shapes:
            # a level counts the thresholds at or below the node's amount: the shape fits iff its own is one
            if (cpu_level >= 0 and cpu_need > cpu_level) or (mem_level >= 0 and mem_need > mem_level):
                frag += p * total
                continue
            if count == 0 or (models and model not in models):
                frag += p * total
                continue
            # gpus ascending: those with at least `milli` free are a suffix
            first = bisect.bisect_left(gpus, milli)
            if len(gpus) - first >= count:
                frag += p * sum(gpus[:first])
            else:
                frag += p * total
        return frag


class LearnedMix:
    """A decaying histogram of the claims seen, with the fragmentation measure of its current mix.

    The measure is rebuilt (its memo starts empty) when the histogram has doubled, up to every
    `refresh_every` observations, so scores stay comparable between rebuilds. Thread-safe.
    """

    def __init__(
        self,
        half_life: float = 5000.0,
        refresh_every: int = 1024,
        histogram: Optional[ShapeHistogram] = None,
        gpu_weight: float = 1.0,
    ) -> None:
        self.histogram = histogram if histogram is not None else ShapeHistogram(half_life)
        self.refresh_every = refresh_every
        self.gpu_weight = gpu_weight
        self.version = 0
        self._lock = threading.Lock()
        self._next = max(16, self.histogram.observed + 1)
        self.frag = self._build()

    def mix(self) -> ShapeMix:
        """The histogram's shapes, each weighted by (1 + gpu_weight x GPUs it asks for): a big task
        that finds no room leaves more idle than a small one, and rare big shapes stay in the mix."""
        return ShapeMix.from_counts(self.histogram.counts()).reweighted(self.gpu_weight).top(0.99, 64)

    def _build(self) -> Fragmentation:
        self.version += 1
        return Fragmentation(self.mix(), memory=True, gpu_only=True)

    def observe(self, shape: TaskShape) -> None:
        """Count one claim; rebuild the measure when it is due and the mix has moved."""
        with self._lock:
            self.histogram.observe(shape)
            if self.histogram.observed >= self._next:
                self._next += min(self._next, self.refresh_every)
                mix = self.mix()
                # a settled mix keeps its measure, and with it every memoised score
                if _distance(mix, self.frag.mix) > MIX_TOLERANCE:
                    self.version += 1
                    self.frag = Fragmentation(mix, memory=True, gpu_only=True)


MIX_TOLERANCE = 0.02  # total variation distance below which a new mix is not worth cold caches


def _distance(a: ShapeMix, b: ShapeMix) -> float:
    """Total variation distance between two mixes."""
    pa, pb = dict(a.shapes), dict(b.shapes)
    return 0.5 * sum(abs(pa.get(s, 0.0) - pb.get(s, 0.0)) for s in set(pa) | set(pb))


def request_shape(request: GpuRequest, device: Device) -> TaskShape:
    """A GPU request as a task shape on GPUs like `device` (its share rounded up to a thousandth)."""
    need = request.memory_on(device)
    return TaskShape(request.count, min(MILLI, max(1, math.ceil(need * MILLI / device.memory_mib - 1e-9))))


def node_free(devices: Sequence[Device], free_mib: Mapping[str, int]) -> NodeFree:
    """One node's healthy devices as a NodeFree (share free per GPU, in thousandths); CPU and memory unknown."""
    healthy = [d for d in devices if d.healthy]
    models = {d.name for d in healthy}
    return NodeFree(
        tuple(max(0, free_mib.get(d.uuid, d.memory_mib)) * MILLI // max(1, d.memory_mib) for d in healthy),
        model=models.pop() if len(models) == 1 else "",
    )


LARGE_NODE = 32  # GPUs: a "node" this big is an emulated or abstract pool; best fit serves it


def fragaware_devices(
    devices: Sequence[Device],
    free_mib: Mapping[str, int],
    fitting: Sequence[Tuple[Device, int]],
    count: int,
    frag: Fragmentation,
) -> List[Tuple[Device, int]]:
    """`count` of the `fitting` (device, MiB) pairs, one at a time where the node's fragmentation grows least.

    Ties go to the device left fullest (best fit), then node and index: with no history (or on
    a node of more than LARGE_NODE GPUs) the choice is binpack's.
    """
    by_node: Dict[str, List[Device]] = {}
    for d in devices:
        if d.healthy:
            by_node.setdefault(d.node, []).append(d)
    free = dict(free_mib)
    if not frag.mix.shapes or any(len(by_node.get(d.node, ())) > LARGE_NODE for d, _ in fitting):
        ordered = sorted(fitting, key=lambda dm: (free[dm[0].uuid] - dm[1], dm[0].node, dm[0].index))
        return list(ordered[:count])
    chosen: List[Tuple[Device, int]] = []
    left = list(fitting)
    for _ in range(count):
        befores: Dict[str, float] = {}
        growths: Dict[Tuple[str, int, int], float] = {}  # devices alike in node, free and need are alike
        best: Optional[Tuple[float, int, str, int]] = None
        best_pair: Optional[Tuple[Device, int]] = None
        for d, mib in left:
            alike = (d.node, free[d.uuid], mib)
            growth = growths.get(alike)
            if growth is None:
                node = by_node.get(d.node, [d])
                if d.node not in befores:
                    befores[d.node] = frag.of(node_free(node, free))
                free[d.uuid] -= mib
                growth = growths[alike] = frag.of(node_free(node, free)) - befores[d.node]
                free[d.uuid] += mib
            key = (round(growth, 6), free[d.uuid] - mib, d.node, d.index)
            if best is None or key < best:
                best, best_pair = key, (d, mib)
        assert best_pair is not None
        chosen.append(best_pair)
        free[best_pair[0].uuid] -= best_pair[1]
        left = [pair for pair in left if pair[0].uuid != best_pair[0].uuid]
    return chosen


__all__ = [
    "MILLI",
    "LearnedMix",
    "request_shape",
    "node_free",
    "fragaware_devices",
    "LARGE_NODE",
    "Fragmentation",
    "NodeFree",
    "ShapeHistogram",
    "ShapeMix",
    "TaskShape",
]
