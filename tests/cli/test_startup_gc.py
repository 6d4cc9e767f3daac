"""`gpupool run`'s start-up and the collector: no collection walks the objects it builds before the
command starts (cli.defer_gc), and the guard's fork freezes them (runner/guard.py), so no later
collection walks them either, the runner's last one at exit included."""

from __future__ import annotations

import subprocess
import sys

from envs import clean_env

PROBE = """\
import gc
import sys

generations = []
gc.callbacks.append(lambda phase, info: generations.append(info["generation"]) if phase == "start" else None)
from gpupool.cli.main import main

code = main(sys.argv[1:])
print("GENERATIONS", *generations)
print("FROZEN", gc.get_freeze_count())
sys.exit(code)
"""


def probe(tmp_path, *args: str) -> dict:
    env = clean_env(HOME=str(tmp_path), GPUPOOL_STATE=str(tmp_path / "state"), GPUPOOL_DEVICES="emulated:2x16GiB")
    done = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines() if line.strip()}
    return {"generations": [int(g) for g in lines["GENERATIONS"]], "frozen": int(lines["FROZEN"][0])}


def test_a_run_walks_its_start_up_objects_in_no_collection(tmp_path):
    seen = probe(tmp_path, "run", "-q", "-n", "1", "-p", "0.5", "--", "true")
    # At most a young collection of what the interpreter made before gpupool was imported, none of
    # the older generations, where the modules, the pool and the claim would be walked again.
    assert max(seen["generations"], default=0) == 0, seen
    assert len(seen["generations"]) <= 1, seen
    # Frozen at the guard's fork: the modules, classes and functions imported by then, thousands.
    assert seen["frozen"] > 10_000, seen


def test_a_verb_without_a_guard_freezes_nothing(tmp_path):
    seen = probe(tmp_path, "status")
    assert seen["frozen"] == 0, seen
