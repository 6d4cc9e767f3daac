"""core.fragmentation: the fragmentation measure, the shape histogram, FGD and fragaware scoring."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.errors import InvalidInput
from gpupool.core.fragmentation import (
    MILLI,
    Fragmentation,
    LearnedMix,
    NodeFree,
    ShapeHistogram,
    ShapeMix,
    TaskShape,
    fragaware_devices,
    node_free,
    request_shape,
)
from gpupool.core.model import Device, GpuRequest
from gpupool.core.nodescore import choose_node, fgd_evaluate, fragaware_evaluate, fullness_score, rank_scores

HALF = TaskShape(1, 500, 1000, 1024)
WHOLE = TaskShape(1, MILLI, 1000, 1024)
TWO = TaskShape(2, MILLI, 2000, 2048)


def test_a_shape_is_validated():
    with pytest.raises(InvalidInput):
        TaskShape(1, 0)
    with pytest.raises(InvalidInput):
        TaskShape(0, 500)
    with pytest.raises(InvalidInput):
        TaskShape(1, 1001)
    assert TaskShape.from_dict(HALF.to_dict()) == HALF


def test_holds_counts_gpus_cpu_memory_and_model():
    node = NodeFree((MILLI, 400), cpu_milli=4000, memory_mib=4096, model="T4")
    assert node.holds(HALF)
    assert not node.holds(TWO)  # only one GPU with a whole one free
    assert not node.holds(TaskShape(1, 500, 5000))  # CPU
    assert not node.holds(TaskShape(1, 500, 0, 8192))  # memory
    assert not node.holds(TaskShape(1, 500, models=("A100",)))
    assert node.holds(TaskShape(1, 500, models=("A100", "T4")))
    assert NodeFree((0,)).holds(TaskShape(0, 0, 10**9))  # CPU and memory unreported: not counted


def test_fragmentation_of_a_node_against_one_shape():
    frag = Fragmentation(ShapeMix([(HALF, 1.0)]))
    # GPUs with less than 500 free cannot hold the task: 300 + 200 are fragments, 800 is not
    assert frag.of(NodeFree((300, 800, 200), 10_000, 10_000)) == 500
    # not enough CPU: everything free is a fragment
    assert frag.of(NodeFree((300, 800, 200), 500, 10_000)) == 1300
    # memory counts unless told not to
    assert frag.of(NodeFree((300, 800), 10_000, 100)) == 1100
    assert Fragmentation(ShapeMix([(HALF, 1.0)]), memory=False).of(NodeFree((300, 800), 10_000, 100)) == 300
    assert frag.of(NodeFree((0, 0), 10_000, 10_000)) == 0


def test_fragmentation_is_the_expectation_over_the_mix():
    mix = ShapeMix([(HALF, 3.0), (WHOLE, 1.0)])
    frag = Fragmentation(mix)
    node = NodeFree((MILLI, 600), 10_000, 10_000)
    # HALF (p .75): nothing is a fragment; WHOLE (p .25): the 600 is
    assert frag.of(node) == pytest.approx(0.25 * 600)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, MILLI), min_size=1, max_size=8),
    st.integers(0, 20_000),
    st.integers(0, 20_000),
)
def test_memoised_fragmentation_equals_a_fresh_one(gpus, cpu, memory):
    mix = ShapeMix([(HALF, 2.0), (WHOLE, 1.0), (TWO, 1.0), (TaskShape(1, 250, 4000, 9000), 1.0)])
    shared = Fragmentation(mix)
    node = NodeFree(tuple(gpus), cpu, memory)
    for other in ((0,) * len(gpus), tuple(sorted(gpus))):
        shared.of(NodeFree(other, cpu, memory))
    assert shared.of(node) == Fragmentation(mix).of(node)
    assert 0 <= shared.of(node) <= sum(gpus) + 1e-6


def test_histogram_decays_old_shapes():
    hist = ShapeHistogram(half_life=10)
    for _ in range(10):
        hist.observe(HALF)
    for _ in range(10):
        hist.observe(WHOLE)
    counts = hist.counts()
    assert counts[WHOLE] > counts[HALF] > 0
    assert counts[HALF] == pytest.approx(counts[WHOLE] * 0.5, rel=0.01)
    mix = hist.mix()
    assert mix.shapes[0][0] == WHOLE and sum(p for _, p in mix.shapes) == pytest.approx(1.0)
    again = ShapeHistogram.from_dict(hist.to_dict())
    assert again.counts() == pytest.approx(counts) and again.observed == 20


def test_histogram_survives_many_observations():
    hist = ShapeHistogram(half_life=1)
    for _ in range(2000):  # the stored scale would overflow without the fold
        hist.observe(HALF)
    assert hist.counts()[HALF] == pytest.approx(2.0)


def test_mix_top_and_reweighted():
    mix = ShapeMix([(HALF, 6.0), (WHOLE, 3.0), (TWO, 1.0)])
    assert [s for s, _ in mix.top(0.85).shapes] == [HALF, WHOLE]
    assert len(mix.top(1.0, limit=1)) == 1
    heavy = mix.reweighted(1.0)  # (1 + GPUs): HALF x1.5, WHOLE x2, TWO x3
    weights = dict(heavy.shapes)
    assert weights[TWO] / weights[HALF] == pytest.approx((1 * 3) / (6 * 1.5))


def test_fragaware_fills_the_gpu_a_half_fits_exactly():
    frag = Fragmentation(ShapeMix([(HALF, 1.0), (WHOLE, 1.0)]))
    partly = NodeFree((MILLI, 500), 10_000, 10_000)
    empty = NodeFree((MILLI, MILLI), 10_000, 10_000)
    on_partly = fragaware_evaluate(partly, HALF, frag)
    on_empty = fragaware_evaluate(empty, HALF, frag)
    assert on_partly is not None and on_empty is not None
    assert on_partly.picks == (1,)  # the half-free GPU, not a whole one
    assert on_partly.score > on_empty.score
    assert fragaware_evaluate(NodeFree((400,), 10_000, 10_000), HALF, frag) is None


def test_fragaware_keeps_cpu_for_gpu_tasks():
    """A CPU-only task goes where the GPUs are already taken, not where it would strand free ones."""
    frag = Fragmentation(ShapeMix([(WHOLE, 1.0)]), gpu_only=True)
    cpu_task = TaskShape(0, 0, 8000, 0)
    busy = NodeFree((0, 0), 10_000, 10_000)
    idle = NodeFree((MILLI, MILLI), 10_000, 10_000)
    on_busy = fragaware_evaluate(busy, cpu_task, frag)
    on_idle = fragaware_evaluate(idle, cpu_task, frag)
    assert on_busy is not None and on_idle is not None and on_busy.score > on_idle.score


def test_fgd_scores_like_the_paper():
    frag = Fragmentation(ShapeMix([(WHOLE, 1.0)]), memory=False)
    node = NodeFree((MILLI, MILLI), 10_000, 10_000)
    shared = fgd_evaluate(node, HALF, frag)
    # a half on a whole GPU makes 500 of fragments: 100 * sigmoid(-0.5), truncated
    assert shared is not None and shared.score == 37 and shared.picks == (0,)
    whole = fgd_evaluate(node, WHOLE, frag)
    assert whole is not None and whole.score == 50 and whole.picks == (0,)
    assert fgd_evaluate(node, TaskShape(3, MILLI), frag) is None


def test_fullness_is_the_extenders_score():
    node = NodeFree((MILLI, 600, MILLI, MILLI))
    packed = fullness_score(node, HALF)
    assert packed is not None and packed.picks == (1,)
    spread = fullness_score(node, HALF, spread=True)
    assert spread is not None and spread.picks == (0,)
    # used after: 400 + 500 of 4000 -> 22.5 % full: binpack 2, spread 7
    assert packed.score == 2 and spread.score == 7


def test_stranded_gpu_is_what_free_cpu_cannot_feed():
    frag = Fragmentation(ShapeMix([(TaskShape(1, MILLI, 10_000, 10_000), 1.0)]))
    assert frag.cpu_per_milli == 10 and frag.memory_per_milli == 10
    assert frag.stranded(NodeFree((MILLI, MILLI), 20_000, 20_000)) == 0
    assert frag.stranded(NodeFree((MILLI, MILLI), 5_000, 20_000)) == 1500  # CPU for half a GPU
    assert frag.stranded(NodeFree((MILLI, MILLI), 20_000, 10_000)) == 1000  # memory for one
    assert frag.stranded(NodeFree((MILLI, MILLI))) == 0  # not reported: not counted


def test_fragaware_puts_a_cpu_heavy_task_where_cpu_is_plenty():
    frag = Fragmentation(ShapeMix([(TaskShape(1, MILLI, 8_000, 0), 1.0)]))
    heavy = TaskShape(1, MILLI, 24_000, 0)
    lean = NodeFree((MILLI,) * 4, 32_000, None)  # 8 CPUs per GPU: the heavy task strands 2 GPUs here
    rich = NodeFree((MILLI,) * 4, 96_000, None)
    on_lean = fragaware_evaluate(lean, heavy, frag)
    on_rich = fragaware_evaluate(rich, heavy, frag)
    assert on_lean is not None and on_rich is not None and on_rich.score > on_lean.score


def test_choose_node_and_rank_scores():
    assert choose_node([None, None]) is None
    assert choose_node([1.0, 3.0, 3.0]) == 1  # the first of equals
    assert choose_node([1.0, 2.5, 3.0], tolerance=1.0) == 1  # near-ties: first in node order
    ranked = rank_scores([1.0, None, 3.0, 3.0, -5.0])
    assert ranked[2] == 10 and max(r for i, r in enumerate(ranked) if i != 2) < 10
    assert ranked[1] == 0 and ranked[3] > ranked[0] > ranked[4] >= 1


def test_learned_mix_rebuilds_as_it_learns():
    learned = LearnedMix(refresh_every=64)
    assert len(learned.frag.mix) == 0
    for _ in range(20):
        learned.observe(WHOLE)
    assert learned.version == 2 and [s for s, _ in learned.frag.mix.shapes] == [WHOLE]
    for _ in range(200):
        learned.observe(HALF)
    assert learned.frag.mix.shapes[0][0] == HALF


def test_device_helpers_and_the_in_node_choice():
    devices = [Device(f"g{i}", i, "A100", 40960, "n") for i in range(3)]
    assert request_shape(GpuRequest(1, fraction=0.5), devices[0]) == TaskShape(1, 500)
    assert request_shape(GpuRequest(2, memory_mib=4096), devices[0]) == TaskShape(2, 100)
    free = {"g0": 40960, "g1": 20480, "g2": 8192}
    assert node_free(devices, free) == NodeFree((1000, 500, 200), model="A100")
    half = [(d, 20480) for d in devices[:2]]
    # no history: best fit, the GPU left fullest (binpack's choice)
    assert fragaware_devices(devices, free, half, 1, Fragmentation(ShapeMix([])))[0][0].uuid == "g1"
    # whole GPUs expected: the same, a whole one stays whole
    whole_mix = Fragmentation(ShapeMix([(TaskShape(1, MILLI), 1.0)]))
    assert fragaware_devices(devices, free, half, 1, whole_mix)[0][0].uuid == "g1"
    picked = fragaware_devices(devices, free, half, 2, whole_mix)
    assert sorted(d.uuid for d, _ in picked) == ["g0", "g1"]


def test_place_with_fragaware_follows_the_mix():
    from gpupool.core.model import Claim, Policy
    from gpupool.core.placement import place

    devices = [Device(f"g{i}", i, "A100", 1000, "n") for i in range(3)]
    allocated = {"g0": 0, "g1": 300, "g2": 600}  # 1000, 700, 400 free
    claim = Claim.single(1, fraction=0.3)
    assert claim.policy is Policy.FRAGAWARE
    # no history: best fit (binpack) puts it on g2 (400 -> 100 left)
    assert place(devices, allocated, claim).slices[0].device_uuid == "g2"
    # expecting 0.4-GPU tasks, g2's 400 is worth keeping: g1 (700 -> 400 left, still fits one)
    mix = Fragmentation(ShapeMix([(TaskShape(1, 400), 1.0)]))
    assert place(devices, allocated, claim, mix).slices[0].device_uuid == "g1"
