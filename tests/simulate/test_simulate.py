"""gpupool simulate: readers, the paper's arrival order, both replay modes and the command, on small clusters."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import List, Sequence

import pytest

from gpupool.cli import simulate as cli_simulate
from gpupool.core.errors import InvalidInput
from gpupool.core.fragmentation import MILLI, TaskShape
from gpupool.simulate.policies import POLICIES, make_policy, typical_mix
from gpupool.simulate.replay import arrival_order, replay_arrival, replay_timeline
from gpupool.simulate.trace import NodeSpec, Task, read_nodes, read_status, read_tasks

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


def synthetic_cluster(n: int = 24, seed: int = 0) -> List[NodeSpec]:
    rng = random.Random(seed)
    nodes = []
    for i in range(n):
        gpus, model = rng.choice([(8, "G2"), (2, "T4"), (4, "V100")])
        nodes.append(NodeSpec(f"node-{i:03d}", gpus, model, cpu_milli=gpus * 12000, memory_mib=gpus * 48 * 1024))
    return nodes


def synthetic_workload(n: int = 300, seed: int = 0, models: Sequence[str] = ()) -> List[Task]:
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.45:
            shape = TaskShape(1, MILLI, 8000, 32768)
        elif kind < 0.85:
            shape = TaskShape(1, rng.choice([250, 470, 500, 810]), 4000, 16384)
        elif kind < 0.93:
            shape = TaskShape(rng.choice([2, 4, 8]), MILLI, 32000, 65536)
        else:
            shape = TaskShape(0, 0, 16000, 32768)
        if models and shape.gpus and rng.random() < 0.3:
            shape = TaskShape(shape.gpus, shape.milli, shape.cpu_milli, shape.memory_mib, tuple(models))
        tasks.append(Task(f"task-{i:04d}", shape, float(i), float(i + rng.randint(1, 60))))
    return tasks


def test_readers_parse_the_openb_columns(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_HEADER + "n0,64000,262144,2,P100\nn1,32000,131072,0,nan\n")
    pods = tmp_path / "pods.csv"
    pods.write_text(
        POD_HEADER
        + "p0,12000,16384,1,460,,LS,Running,0,100,0\n"
        + "p1,88000,327680,8,1000,V100M16|V100M32,LS,Running,5,,5\n"
        + "p2,4000,8192,0,0,,BE,Running,7,9,7\n"
    )
    read = read_nodes(nodes)
    assert read[0] == NodeSpec("n0", 2, "P100", 64000, 262144) and read[1].model == ""
    tasks = read_tasks(pods)
    assert tasks[0].shape == TaskShape(1, 460, 12000, 16384) and tasks[0].deleted == 100
    assert tasks[1].shape == TaskShape(8, MILLI, 88000, 327680, ("V100M16", "V100M32")) and tasks[1].deleted is None
    assert tasks[2].shape == TaskShape(0, 0, 4000, 8192)


def test_readers_say_what_is_wrong(tmp_path):
    bad = tmp_path / "nodes.csv"
    bad.write_text("sn,gpu\nn0,2\n")
    with pytest.raises(InvalidInput, match="missing column"):
        read_nodes(bad)
    with pytest.raises(InvalidInput, match="no such file"):
        read_tasks(tmp_path / "absent.csv")
    notnum = tmp_path / "pods.csv"
    notnum.write_text(POD_HEADER + "p0,many,1,1,500,,LS,Running,0,1,0\n")
    with pytest.raises(InvalidInput, match="not a number"):
        read_tasks(notnum)


def test_the_cluster_of_a_live_pool(tmp_path):
    status = {
        "node": "a",
        "devices": [
            {"uuid": "g0", "index": 0, "name": "A100", "memory_mib": 40960, "node": "a", "allocated_mib": 20480},
            {"uuid": "g1", "index": 1, "name": "A100", "memory_mib": 40960, "node": "a", "allocated_mib": 0},
            {"uuid": "g2", "index": 0, "name": "T4", "memory_mib": 16384, "node": "b", "healthy": False},
        ],
        "leases": [],
    }
    path = tmp_path / "status.json"
    path.write_text(json.dumps(status))
    nodes = read_status(path)
    assert len(nodes) == 1 and nodes[0].free().gpus == (500, MILLI) and nodes[0].model == "A100"
    assert read_nodes(path) == nodes
    path.write_text("{")
    with pytest.raises(InvalidInput, match="not JSON"):
        read_status(path)


def test_arrival_order_follows_the_paper():
    tasks = synthetic_workload(200)
    capacity = 40 * MILLI
    order = arrival_order(tasks, capacity, 1.3, seed=3)
    asked = sum(t.shape.total_milli for t in order)
    assert asked <= 1.3 * capacity
    assert order == arrival_order(tasks, capacity, 1.3, seed=3)
    assert order != arrival_order(tasks, capacity, 1.3, seed=4)
    workload_total = sum(t.shape.total_milli for t in tasks)
    many = arrival_order(tasks, capacity, workload_total / capacity + 1, seed=3)
    assert {t.name for t in tasks} <= {t.name for t in many}  # every task once, then draws
    assert any("-draw-" in t.name for t in many)
    assert sum(t.shape.total_milli for t in many) > workload_total + 0.9 * capacity - 8 * MILLI


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_replays_consistently(name):
    nodes = synthetic_cluster()
    tasks = synthetic_workload()
    policy = make_policy(name, [t.shape for t in tasks])
    result = replay_arrival(nodes, tasks, policy, 1.3, seed=1)
    capacity = sum(n.gpus for n in nodes)
    assert result.placed + result.failed == result.tasks
    assert 0 <= result.allocated_milli <= capacity * MILLI
    assert 0 <= result.unallocated_gpu_percent <= 100
    assert result.failed and result.first_failure_arrival_percent is not None
    assert result.curve[0] == (0.0, 0.0) and 120.0 < result.curve[-1][0] <= 130.0
    assert result.curve[-1][1] == pytest.approx(100.0 - result.unallocated_gpu_percent)
    again = replay_arrival(nodes, tasks, make_policy(name, [t.shape for t in tasks]), 1.3, seed=1)
    assert again.to_dict() | {"seconds": 0} == result.to_dict() | {"seconds": 0}


def test_gpu_model_constraints_are_honoured():
    nodes = [NodeSpec("a", 8, "G2", 96000, 10**6), NodeSpec("b", 8, "T4", 96000, 10**6)]
    only_t4 = [Task(f"t{i}", TaskShape(1, MILLI, 1000, 1024, ("T4",))) for i in range(12)]
    result = replay_arrival(nodes, only_t4, make_policy("fragaware", []), 1.0, seed=1)
    assert result.placed == 8 and result.allocated_milli == 8 * MILLI  # the G2 GPUs stay free


def test_cpu_and_memory_filter_like_kubernetes():
    nodes = [NodeSpec("a", 4, "G2", cpu_milli=8000, memory_mib=10**6)]
    tasks = [Task(f"t{i}", TaskShape(1, MILLI, 3000, 1024)) for i in range(4)]
    result = replay_arrival(nodes, tasks, make_policy("binpack", []), 1.0, seed=1)
    assert result.placed == 2  # two tasks take 6 of the 8 CPUs: two GPUs are stranded


def test_timeline_mode_frees_what_leaves():
    nodes = [NodeSpec("a", 1, "G2", 10_000, 10_000)]
    tasks = [Task(f"t{i}", TaskShape(1, MILLI, 1000, 1024), float(10 * i), float(10 * i + 5)) for i in range(5)]
    policy = make_policy("fragaware", [t.shape for t in tasks])
    result = replay_timeline(nodes, tasks, policy, seed=1)
    assert result.placed == 5 and result.failed == 0
    forever = [Task(t.name, t.shape, t.created, None) for t in tasks]
    assert replay_timeline(nodes, forever, make_policy("fragaware", []), seed=1).placed == 1


def test_fragaware_strands_less_than_random_and_spread():
    nodes = synthetic_cluster(40, seed=2)
    tasks = synthetic_workload(400, seed=2)
    shapes = [t.shape for t in tasks]
    ours = [
        replay_arrival(nodes, tasks, make_policy("fragaware", shapes), 1.3, s).unallocated_gpu_percent for s in (1, 2)
    ]
    rand = [replay_arrival(nodes, tasks, make_policy("random", shapes), 1.3, s).unallocated_gpu_percent for s in (1, 2)]
    spread = [
        replay_arrival(nodes, tasks, make_policy("spread", shapes), 1.3, s).unallocated_gpu_percent for s in (1, 2)
    ]
    assert sum(ours) < sum(rand) and sum(ours) < sum(spread)


def test_typical_mix_covers_the_popular_shapes():
    shapes = [TaskShape(1, MILLI, 1000)] * 90 + [TaskShape(1, 500, 1000)] * 8 + [TaskShape(2, MILLI, 1000)] * 2
    mix = typical_mix(shapes, popularity=0.95)
    assert [s.gpus for s, _ in mix.shapes] == [1, 1]  # the 2 % shape is left out
    assert sum(p for _, p in mix.shapes) == pytest.approx(1.0)


def _run_cli(argv: List[str]) -> int:
    parser = argparse.ArgumentParser()
    cli_simulate.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return int(args.func(args))


def _write_trace(tmp_path: Path) -> List[str]:
    nodes = synthetic_cluster(12)
    tasks = synthetic_workload(150, models=("T4",))
    (tmp_path / "nodes.csv").write_text(
        NODE_HEADER + "".join(f"{n.name},{n.cpu_milli},{n.memory_mib},{n.gpus},{n.model}\n" for n in nodes)
    )
    (tmp_path / "pods.csv").write_text(
        POD_HEADER
        + "".join(
            f"{t.name},{t.shape.cpu_milli},{t.shape.memory_mib},{t.shape.gpus},{t.shape.milli},"
            f"{'|'.join(t.shape.models)},LS,Running,{t.created:.0f},{t.deleted:.0f},0\n"
            for t in tasks
        )
    )
    return ["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]


def test_the_command_prints_json(tmp_path, capsys):
    argv = _write_trace(tmp_path)
    assert _run_cli([*argv, "--json", "--seed", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "fragaware" and out["seed"] == 2
    assert 0 <= out["unallocated_gpu_percent"] <= 100
    assert {"fragmentation_percent", "first_failure_arrival_percent", "placed", "failed"} <= set(out)


def test_the_command_compares_policies_and_writes_out(tmp_path, capsys):
    argv = _write_trace(tmp_path)
    assert _run_cli([*argv, "--policy", "all", "--mode", "timeline", "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("GPUs left unallocated") == len(POLICIES)
    body = json.loads((tmp_path / "out" / "result.json").read_text())
    assert [r["policy"] for r in body] == list(POLICIES)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no PNG" in captured.err
    else:
        assert (tmp_path / "out" / "curve.png").stat().st_size > 1000


def test_the_command_refuses_bad_input(tmp_path):
    argv = _write_trace(tmp_path)
    with pytest.raises(InvalidInput, match="unknown"):
        _run_cli([*argv, "--policy", "nope"])
    with pytest.raises(InvalidInput, match="--arrive"):
        _run_cli([*argv, "--arrive", "0"])
