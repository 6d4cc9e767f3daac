"""Suspend/resume on a real GPU (issue 28): seconds and GiB/s each way for 1, 8 and 30 GiB of state.

For each size a child torch process fills that many GiB of device memory with seeded random
bytes and sums them; the bench suspends it through `backend_named("cuda")`, reads the GPU's
memory in use while it is parked, resumes it, and the child sums its memory again (the sums
must match) - two cycles per size. Then, on a 1 GiB child, what a SIGSTOP does to the driver's
calls: suspend, SIGSTOP, SIGCONT, resume (what a runner that stops the rest of a tree does), and
resume, or suspend, while the process is stopped (each call is given a while, then the process
is continued and what happened is recorded).

Needs torch and cuda-bindings, not the rest of gpupool's extras; run from the repo root:

    PYTHONPATH=src python3 benchmarks/bench_suspend_gpu.py [--sizes 1,8,30] [--out FILE]

Writes benchmarks/results/suspend-gpu.json unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from gpupool.pooling.isolation.parking import CudaBackend, backend_named, cuda_unavailable_reason

ROOT = Path(__file__).resolve().parent
GIB = 1 << 30
LOCK_TIMEOUT_S = 60.0
# How long a driver call on a stopped process is given before the bench continues the process.
STOPPED_CALL_S = 20.0

# Fills argv[1] GiB in 1 GiB chunks of seeded random bytes; answers "sum" with the per-chunk sums.
CHILD = r"""
import sys, torch
gib = float(sys.argv[1])
g = torch.Generator(device="cuda"); g.manual_seed(1234)
chunks, left = [], int(gib * (1 << 30)) // 4 * 4
while left > 0:
    n = min(left, 1 << 30)
    chunks.append(torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 256, generator=g))
    left -= n
def sums():
    torch.cuda.synchronize()
    return [int(c.view(torch.int32).sum(dtype=torch.int64)) for c in chunks]
first = sums()
print("ready", torch.__version__, ",".join(map(str, first)), flush=True)
for line in sys.stdin:
    if line.strip() == "sum":
        print("same" if sums() == first else "DIFFERENT", flush=True)
    else:
        break
"""


class Child:
    """A torch process holding `gib` GiB of known bytes on GPU 0."""

    def __init__(self, gib: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(gib)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0")),
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "ready":
            raise SystemExit(f"the {gib} GiB child did not start (exit {self.proc.wait()})")
        self.torch = line[1]
        self.pid = self.proc.pid

    def intact(self) -> bool:
        """Whether the child's device memory still holds what it wrote."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("sum\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip() == "same"

    def end(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


def smi(query: str, *extra: str) -> List[List[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits", *extra],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[p.strip() for p in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_used_mib() -> int:
    return int(smi("gpu=memory.used", "-i", "0")[0][0])


def process_mib(pid: int) -> Optional[int]:
    """What nvidia-smi lists for `pid` (None when it is not listed)."""
    rows = [int(r[1]) for r in smi("compute-apps=pid,used_memory") if r[0] == str(pid) and r[1].isdigit()]
    return sum(rows) if rows else None


def cycle(backend: CudaBackend, child: Child, gib: float) -> Dict[str, Any]:
    before = gpu_used_mib()
    t0 = time.monotonic()
    parked = backend.suspend([child.pid], LOCK_TIMEOUT_S)
    suspend_s = time.monotonic() - t0
    steps = dict(backend.timings)
    parked_mib = gpu_used_mib()
    listed = process_mib(child.pid)
    t0 = time.monotonic()
    backend.resume(parked, {})
    resume_s = time.monotonic() - t0
    steps.update(backend.timings)
    return {
        "state_gib": gib,
        "host_bytes": parked.host_bytes,
        "suspend_s": round(suspend_s, 3),
        "resume_s": round(resume_s, 3),
        # GiB/s over the checkpoint and restore calls themselves (the figure), and over the whole call.
        "checkpoint_gib_per_s": round(gib / steps["checkpoint_s"], 2),
        "restore_gib_per_s": round(gib / steps["restore_s"], 2),
        "suspend_gib_per_s": round(gib / suspend_s, 2),
        "resume_gib_per_s": round(gib / resume_s, 2),
        "steps_s": {k: round(v, 4) for k, v in steps.items()},
        "gpu_used_mib_before": before,
        "gpu_used_mib_parked": parked_mib,
        "process_mib_parked": listed,
        "gpu_used_mib_after": gpu_used_mib(),
        "data_intact": child.intact(),
    }


def bounded(call: Callable[[], object], pid: int) -> Dict[str, Any]:
    """Run `call`; if it has not returned after STOPPED_CALL_S, SIGCONT `pid` and wait for it again."""
    box: Dict[str, Any] = {}

    def target() -> None:
        try:
            call()
            box["ok"] = True
        except Exception as err:  # recorded, not raised: this is what we came to see
            box["ok"], box["error"] = False, str(err)

    thread = threading.Thread(target=target, daemon=True)
    t0 = time.monotonic()
    thread.start()
    thread.join(STOPPED_CALL_S)
    result: Dict[str, Any] = {"returned_while_stopped": not thread.is_alive()}
    if thread.is_alive():
        os.kill(pid, signal.SIGCONT)
        thread.join(60)
        result["returned_after_sigcont"] = not thread.is_alive()
    result.update(box, seconds=round(time.monotonic() - t0, 3))
    return result


def stopped_between(backend: CudaBackend, child: Child) -> Dict[str, Any]:
    """Suspend, SIGSTOP, SIGCONT, then resume: a tree stopped and continued around a parked process."""
    parked = backend.suspend([child.pid], LOCK_TIMEOUT_S)
    os.kill(child.pid, signal.SIGSTOP)
    time.sleep(1)
    os.kill(child.pid, signal.SIGCONT)
    backend.resume(parked, {})
    return {"ok": True, "data_intact": child.intact()}


def resume_while_stopped(backend: CudaBackend, child: Child) -> Dict[str, Any]:
    """Resume while the process is still stopped: does restore need the process's own threads?"""
    parked = backend.suspend([child.pid], LOCK_TIMEOUT_S)
    os.kill(child.pid, signal.SIGSTOP)
    case = bounded(lambda: backend.resume(parked, {}), child.pid)
    os.kill(child.pid, signal.SIGCONT)
    case["data_intact"] = bool(case.get("ok")) and child.intact()
    return case


def suspend_while_stopped(backend: CudaBackend, child: Child) -> Dict[str, Any]:
    """Suspend a process that is already stopped (a runner that stops the tree first)."""
    os.kill(child.pid, signal.SIGSTOP)
    box: Dict[str, Any] = {}
    case = bounded(lambda: box.setdefault("parked", backend.suspend([child.pid], LOCK_TIMEOUT_S)), child.pid)
    os.kill(child.pid, signal.SIGCONT)
    if "parked" in box:
        backend.resume(box["parked"], {})
        case["data_intact"] = child.intact()
    return case


def stop_cases(backend: CudaBackend) -> Dict[str, Any]:
    """What SIGSTOP does to the driver's calls, each case on a fresh 1 GiB child."""
    cases: Dict[str, Any] = {}
    for case in (stopped_between, resume_while_stopped, suspend_while_stopped):
        child = Child(1)
        try:
            cases[case.__name__] = case(backend, child)
        except Exception as err:  # recorded: what the driver said is the finding
            cases[case.__name__] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        finally:
            child.end()
        print(case.__name__, json.dumps(cases[case.__name__]), flush=True)
    return cases


def write(report: Dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,30", help="GiB of device state per child, comma-separated")
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "results" / "suspend-gpu.json"))
    parser.add_argument("--no-stop-cases", action="store_true", help="skip the SIGSTOP cases")
    args = parser.parse_args(argv)

    reason = cuda_unavailable_reason()
    if reason is not None:
        print(f"cannot measure: {reason}", file=sys.stderr)
        return 2
    backend = backend_named("cuda")
    assert isinstance(backend, CudaBackend)
    name, driver, total = smi("gpu=name,driver_version,memory.total", "-i", "0")[0]
    report: Dict[str, Any] = {
        "gpu": name,
        "driver": driver,
        "gpu_memory_mib": int(total),
        "python": platform.python_version(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": [],
    }
    for gib in (float(s) for s in args.sizes.split(",") if s.strip()):
        child = Child(gib)
        report["torch"] = child.torch
        try:
            for n in range(1, args.cycles + 1):
                row = dict(cycle(backend, child, gib), cycle=n)
                report["runs"].append(row)
                print(
                    f"{gib:g} GiB cycle {n}: suspend {row['suspend_s']:.2f} s "
                    f"(checkpoint {row['checkpoint_gib_per_s']} GiB/s), resume {row['resume_s']:.2f} s "
                    f"(restore {row['restore_gib_per_s']} GiB/s), parked GPU used {row['gpu_used_mib_parked']} MiB "
                    f"(before {row['gpu_used_mib_before']}), data intact {row['data_intact']}",
                    flush=True,
                )
        finally:
            child.end()
    out = Path(args.out)
    write(report, out)  # before the SIGSTOP cases, which may leave a driver call hanging
    if not args.no_stop_cases:
        report["sigstop"] = stop_cases(backend)
        between = report["sigstop"]["stopped_between"]
        report["restore_after_sigstop_sigcont"] = bool(between.get("ok") and between.get("data_intact"))
        write(report, out)
    print(f"wrote {out}")
    return 0 if all(r["data_intact"] for r in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
