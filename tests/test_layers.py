"""The house rules of docs/architecture/index.md, checked on the source: floors and the stdlib-only workload side."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from typing import Iterator, Set, Tuple

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpupool"

# Each folder under src/gpupool is one floor. Lower floors never import higher ones; a folder may import
# its own floor and below.
FLOOR = {
    "core": 0,
    # The pool and its store, the devices it pools, the isolation it hands out.
    "pooling": 1,
    "simulate": 1,
    # `gpupool run` and the pool client.
    "workload": 2,
    # The HTTP API, the watchdog, Jupyter kernels on a share (which reuse the runner's lease machinery).
    "serving": 2,
    "train": 3,
    "jobs": 3,
    "kube": 3,
    # bench runs the trainer as pool jobs: above both.
    "bench": 4,
    "cli": 5,
}
# The trainer knows the distributed env contract and nothing of the pool; simulate measures core placement alone.
ONLY = {"train": {"core", "train"}, "simulate": {"core", "simulate"}}


def _zipapp_folders() -> Tuple[str, ...]:
    spec = importlib.util.spec_from_file_location("build_pyz", SRC.parents[1] / "tools" / "build_pyz.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.PACKAGES)


# What runs inside the user's training container: the folders gpupool-run.pyz ships.
WORKLOAD_SIDE = _zipapp_folders()


def imports(path: Path, top_level_only: bool) -> Iterator[Tuple[str, int]]:
    """(imported module, line) for each import; relative ones resolved inside gpupool."""
    tree = ast.parse(path.read_text(), str(path))
    package = path.relative_to(SRC.parent).with_suffix("").parts[:-1]
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                yield ".".join(base + ((node.module,) if node.module else ())), node.lineno
            else:
                yield node.module or "", node.lineno


def gpupool_sources(package: str) -> Iterator[Path]:
    return (p for p in (SRC / package).rglob("*.py") if "_pb2" not in p.name)


@pytest.mark.parametrize("package", sorted(FLOOR))
def test_lower_floors_never_import_higher_ones(package):
    wrong: Set[str] = set()
    for path in gpupool_sources(package):
        for module, line in imports(path, top_level_only=False):
            parts = module.split(".")
            if parts[0] != "gpupool" or len(parts) < 2 or parts[1] not in FLOOR:
                continue
            target = parts[1]
            allowed = ONLY.get(package)
            if FLOOR[target] > FLOOR[package] or (allowed is not None and target not in allowed):
                wrong.add(f"{path.relative_to(SRC)}:{line} imports gpupool.{target}")
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("package", WORKLOAD_SIDE)
def test_workload_side_imports_only_itself(package):
    # Not even lazily: what the zipapp lacks would fail in a user's container, not here.
    outside: Set[str] = set()
    for path in gpupool_sources(package):
        for module, line in imports(path, top_level_only=False):
            parts = module.split(".")
            if parts[0] == "gpupool" and len(parts) > 1 and parts[1] != "logs" and parts[1] not in WORKLOAD_SIDE:
                outside.add(f"{path.relative_to(SRC)}:{line} imports {module}")
    assert not outside, sorted(outside)


@pytest.mark.parametrize("package", WORKLOAD_SIDE)
def test_workload_side_imports_only_the_standard_library_at_import_time(package):
    # Optional libraries (nvidia-ml-py ...) may be imported lazily inside functions.
    third_party: Set[str] = set()
    for path in gpupool_sources(package):
        for module, line in imports(path, top_level_only=True):
            root = module.split(".")[0]
            if root and root != "gpupool" and root not in sys.stdlib_module_names and root != "__future__":
                third_party.add(f"{path.relative_to(SRC)}:{line} imports {module}")
    assert not third_party, sorted(third_party)


def test_the_pure_part_of_jobs_never_imports_an_executor():
    # jobs/ is split as TorchX's specs/ and schedulers/: spec, plan, environment, lifecycle, phase,
    # rendezvous and manifests are pure; each executor (executors/local/, executors/kubernetes.py
    # with kube_status.py) owns its I/O and none imports another.
    executors = SRC / "jobs" / "executors"
    owner = {"local": "local", "kubernetes": "kubernetes", "kube_status": "kubernetes"}

    def executor_of(parts: Tuple[str, ...]) -> str:
        return owner.get(parts[0].removesuffix(".py"), "") if parts else ""

    wrong: Set[str] = set()
    for path in gpupool_sources("jobs"):
        inside = executors in path.parents
        mine = executor_of(path.relative_to(executors).parts) if inside else ""
        for module, line in imports(path, top_level_only=False):
            parts = tuple(module.split("."))
            if parts[:3] != ("gpupool", "jobs", "executors"):
                continue
            theirs = executor_of(parts[3:])
            if not inside or (mine and theirs and theirs != mine):
                wrong.add(f"{path.relative_to(SRC)}:{line} imports {module}")
    assert not wrong, sorted(wrong)
