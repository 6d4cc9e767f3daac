"""`make demo`: four `gpupool run` jobs share an emulated 2x16GiB pool; one waits in the queue.

Three jobs take half a GPU each and one takes 8 GiB on two GPUs, which is
more than the pool holds at once: the fourth queues until a half-GPU job
ends. The demo shows `gpupool status` while they run and checks that every
job saw its share and that everything is released at the end. Exits
non-zero if anything is off.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / ".demo"
PYZ = ROOT / "dist" / "gpupool-run.pyz"
# The zipapp is what pods run; fall back to the package when it is not built.
# A short name in the progress lines when there is one; the demo job needs only the stdlib.
PYTHON = "python3" if shutil.which("python3") else sys.executable
GPUPOOL = [sys.executable, str(PYZ)] if PYZ.exists() else [sys.executable, "-m", "gpupool.cli.workload"]

# The stand-in training job: shows what it was given, then "trains" for argv[1] seconds.
CHILD = """\
import os, sys, time
e = os.environ
print("sees CUDA_VISIBLE_DEVICES=%s limit_mib=%s fraction=%s allocator_limit_mib=%s" % (
    e["CUDA_VISIBLE_DEVICES"], e["GPUPOOL_MEMORY_LIMIT_MIB"], e["GPUPOOL_MEMORY_FRACTION"],
    e["GPUPOOL_ALLOCATOR_LIMIT_MIB"]), flush=True)
time.sleep(float(sys.argv[1]))
"""

JOBS = [
    ("job1", ["-n", "1", "-p", "0.5"], 2.5),
    ("job2", ["-n", "1", "-p", "0.5"], 4.0),
    ("job3", ["-n", "1", "-p", "0.5"], 4.0),
    ("job4", ["-n", "2", "-m", "8192"], 1.0),
]


def gpupool(env: Dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(GPUPOOL + list(args), env=env, capture_output=True, text=True, timeout=30)


def pump(name: str, stream, sink: List[str]) -> None:
    for line in stream:
        sink.append(line.rstrip("\n"))
        print(f"[{name}] {line}", end="", flush=True)


def main() -> int:
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("GPUPOOL_SERVER", "GPUPOOL_CONFIG", "PYTHONPATH")}
    env.update(GPUPOOL_STATE=str(DEMO / "state"), GPUPOOL_DEVICES="emulated:2x16GiB", PYTHONUNBUFFERED="1")
    env["HOME"] = str(DEMO)  # ignore any ~/.gpupool/client.yaml: this demo is about the embedded pool
    print(f"== gpupool demo: embedded pool in {DEMO / 'state'}, GPUPOOL_DEVICES=emulated:2x16GiB")
    print(f"== using {' '.join(GPUPOOL[1:])}\n")
    job = DEMO / "job.py"
    job.write_text(CHILD)
    started = time.time()
    procs, outputs, pumps = {}, {}, []
    for name, share, seconds in JOBS:
        cmd = GPUPOOL + [
            "run",
            *share,
            "--wait",
            "30",
            "--label",
            name,
            "--",
            PYTHON,
            str(job.relative_to(ROOT)),
            str(seconds),
        ]
        procs[name] = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        outputs[name] = []
        t = threading.Thread(target=pump, args=(name, procs[name].stdout, outputs[name]), daemon=True)
        t.start()
        pumps.append(t)
        time.sleep(0.3)  # a fixed start order makes the placement (and who waits) predictable

    problems: List[str] = []
    deadline = time.time() + 15
    status: dict = {}
    while time.time() < deadline:
        status = json.loads(gpupool(env, "status", "--json").stdout)
        if len(status["leases"]) == 3 and status["queued"] == 1:
            break
        time.sleep(0.1)
    else:
        problems.append(f"expected 3 leases and 1 queued claim while running, saw {status}")
    print("\n== gpupool status (while the jobs run; job4 waits for two GPUs with 8 GiB free)")
    print(gpupool(env, "status").stdout)

    for name, proc in procs.items():
        if proc.wait(timeout=30) != 0:
            problems.append(f"{name} exited with {proc.returncode}")
    for t in pumps:
        t.join(timeout=5)

    seen = {name: next((ln for ln in lines if ln.startswith("sees ")), "") for name, lines in outputs.items()}
    for name in ("job1", "job2", "job3"):
        if "limit_mib=8192 fraction=0.5 " not in seen[name]:
            problems.append(f"{name} did not see half a GPU: {seen[name]!r}")
    if "limit_mib=8192,8192" not in seen["job4"] or seen["job4"].count("GPU-emu-") != 2:
        problems.append(f"job4 did not see 8 GiB on two GPUs: {seen['job4']!r}")
    if not any("Waiting up to 30s in the queue" in ln for ln in outputs["job4"]):
        problems.append("job4 never waited in the queue")

    final = json.loads(gpupool(env, "status", "--json").stdout)
    print("== gpupool status (after all jobs)")
    print(gpupool(env, "status").stdout)
    if final["leases"] or any(d["allocated_mib"] for d in final["devices"]):
        problems.append(f"something is still allocated at the end: {final}")

    elapsed = time.time() - started
    if problems:
        print("== demo FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"== demo OK in {elapsed:.1f}s: 4 jobs shared 2 GPUs, one queued, all released")
    return 0


if __name__ == "__main__":
    sys.exit(main())
