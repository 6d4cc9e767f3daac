"""Run a benchmark's plan through the pool and the local executor, and report on it.

Each run's jobs are submitted like `gpupool submit` does (`LocalExecutor.dryrun` then
`schedule`): a detached supervisor per job claims the job's GPUs as one gang (queued whole
if the pool is busy), starts the workers with their rendezvous and isolation env and frees
everything when the job ends. The driver follows the jobs, shows a progress bar per run on a
terminal, and on SIGINT/SIGTERM cancels every job it started and waits for their
supervisors to end, so an interrupted benchmark leaves no process and no lease.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core.errors import GpupoolError, Unsatisfiable
from ..core.model import Claim, Device
from ..core.placement import could_ever_fit
from ..jobs.executors.local import LocalExecutor
from ..jobs.plan import gang_claim
from ..jobs.spec import JobSpec
from . import figures
from .plan import Kind, Run, Settings, job_specs, job_tag, most_concurrent
from .report import write_all

POLL_S = 0.2
SUPERVISOR_EXIT_S = 30.0


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; every job was cancelled. `exit_code` is 128 + the signal."""

    def __init__(self, signum: int, report: Optional[Dict[str, str]] = None) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
        self.exit_code = 128 + signum
        self.report = report


@dataclass(frozen=True)
class PoolChoice:
    """Which pool the jobs claim from (as `gpupool submit`'s flags choose it)."""

    servers: Tuple[str, ...] = ()
    state_dir: Optional[Path] = None
    ttl_s: float = 30.0


@dataclass
class _Job:
    spec: JobSpec
    tag: str
    executor: LocalExecutor
    status: str = "Pending"
    message: str = ""
    done: bool = False
    phase: str = ""
    step: int = 0


@dataclass
class Bench:
    """One `gpupool bench scaling|share` invocation."""

    kind: Kind
    settings: Settings
    runs: Sequence[Run]
    out: Path
    pool: PoolChoice = PoolChoice()
    progress: bool = False
    stream: IO[str] = sys.stderr
    prefix: str = field(default_factory=lambda: f"bench-{secrets.token_hex(3)}")
    _live: List[_Job] = field(default_factory=list)
    _rows: List[Dict[str, Any]] = field(default_factory=list)

    # --- entry -----------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        """Every run in order; returns the report (also written to `out`). Raises
        Interrupted after cancelling everything when a signal arrives."""
        self.out = self.out.resolve()
        devices = self._check_pool()
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for i, run in enumerate(self.runs):
                self._rows.append(self._one(i, run))
        except Interrupted as stop:
            self._stop_all(previous)
            partial = self._rows and write_all(self._report(devices, interrupted=True), self.out)
            raise Interrupted(stop.signum, partial or None) from None
        except BaseException:  # a job that cannot start, a bug: the others must not run on
            self._stop_all(previous)
            raise
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        report = self._report(devices)
        report["files"] = write_all(report, self.out)
        return report

    def _stop_all(self, handlers: Mapping[signal.Signals, Any]) -> None:
        for s in handlers:
            signal.signal(s, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        self._cancel_live()

    def _on_signal(self, signum: int, frame: object) -> None:
        raise Interrupted(signum)

    def _say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    # --- before anything runs ----------------------------------------------------
    def _check_pool(self) -> List[Device]:
        """Refuse at once a run that this pool could never hold (waiting cannot help)."""
        from ..workload.client.resolve import connect

        with connect(list(self.pool.servers) or None, self.pool.state_dir) as client:
            devices = list(client.status().devices)
        for run in self.runs:
            specs = job_specs(self.settings, run, self.prefix, str(self.out))
            claims = [c for c in (gang_claim(s) for s in specs) if c is not None]
            together = Claim(tuple(r for c in claims for r in c.requests), claims[0].policy)
            placement = could_ever_fit(devices, together)
            if not placement.fits:
                where = "" if run.gpu_index is None else f" on GPU {run.gpu_index}"
                raise Unsatisfiable(
                    f"{self.kind.value} run {run.label}: {run.jobs * run.workers} worker(s) each holding "
                    f"{run.fraction:g} of a GPU{where} can never fit this pool of {len(devices)} GPU(s) "
                    f"({placement.reason}); "
                    + (
                        "lower --gpus or --fraction"
                        if self.kind is Kind.SCALING
                        else "raise the smallest --fractions value or pick another --gpu-index"
                    )
                )
        return devices

    # --- one run ---------------------------------------------------------------
    def _one(self, i: int, run: Run) -> Dict[str, Any]:
        run_dir = self.out / "runs" / run.key
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        jobs = []
        for j, spec in enumerate(job_specs(self.settings, run, self.prefix, str(run_dir), most_concurrent(self.runs))):
            executor = LocalExecutor(self.pool.state_dir, list(self.pool.servers), self.pool.ttl_s)
            jobs.append(_Job(spec, job_tag(run, j), executor))
        total = len(jobs) * (self.settings.warmup + self.settings.steps)
        title = f"[{i + 1}/{len(self.runs)}] {run.label}"
        if not self.progress:
            self._say(f"{title}: {len(jobs)} job(s) of {run.workers} worker(s): {', '.join(j.spec.name for j in jobs)}")
        bar = _bar(total, title) if self.progress else None
        try:
            for job in jobs:
                self._live.append(job)  # first: a signal right after schedule() still cancels it
                job.executor.schedule(job.executor.dryrun(job.spec))
            error = self._follow(jobs, run_dir, bar)
        finally:
            if bar is not None:
                bar.close()
        self._live = [j for j in self._live if j not in jobs]
        row = self._row(run, jobs, run_dir, error)
        self._say(f"{title}: {_summary(row)}")
        return row

    def _follow(self, jobs: List[_Job], run_dir: Path, bar: Any) -> Optional[str]:
        """Poll the jobs to their end; cancel the rest of the run when one fails (its peers
        would wait at the start line). Returns an error message or None."""
        error: Optional[str] = None
        while True:
            for job in jobs:
                desc = job.executor.describe(job.spec.name)
                job.status, job.message, job.done = str(desc.status), desc.message, desc.terminal
                _reap(job.executor)
                try:
                    prog = json.loads((run_dir / f"progress-{job.tag}.json").read_text())
                    job.phase, job.step = str(prog["phase"]), int(prog["step"])
                except (OSError, ValueError, KeyError):
                    pass
            failed = [j for j in jobs if j.done and j.status != "Succeeded"]
            if failed and error is None:
                error = "; ".join(f"job {j.spec.name} {j.status.lower()}: {j.message}{_log_tail(j)}" for j in failed)
                for other in jobs:
                    if not other.done:
                        other.executor.cancel(other.spec.name)
            if bar is not None:
                bar.n = sum(j.step for j in jobs)
                states = sorted({j.status if j.status != "Running" else (j.phase or "starting") for j in jobs})
                bar.set_postfix_str(",".join(s.lower() for s in states), refresh=False)
                bar.refresh()
            if all(j.done for j in jobs):
                for job in jobs:
                    _wait_supervisor(job.executor)
                return error
            time.sleep(POLL_S)

    def _row(self, run: Run, jobs: List[_Job], run_dir: Path, error: Optional[str]) -> Dict[str, Any]:
        per_job: List[Dict[str, Any]] = []
        if error is None:
            for job in jobs:
                ranks = [json.loads(p.read_text()) for p in sorted(run_dir.glob(f"result-{job.tag}-r*.json"))]
                if len(ranks) != run.workers:
                    error = f"job {job.spec.name} wrote {len(ranks)} of {run.workers} results; see gpupool logs {job.spec.name}"
                    break
                per_job.append(figures.job_figures(ranks))
        base_row = {"label": run.label, "jobs": len(jobs), "job_names": [j.spec.name for j in jobs]}
        if error is not None:
            return {**base_row, "gpus": run.workers, "fraction": run.fraction, "error": error}
        if run.kind is Kind.SCALING:
            # The smallest GPU count that ran is the baseline, this run when it is the first.
            base = next((r["_job"] for r in self._rows if "_job" in r), per_job[0])
            row = figures.scaling_row(run, per_job[0], base)
            return {**base_row, **row, "_job": per_job[0]}
        whole = next(
            (r["images_per_second"] for r in self._rows if r.get("fraction") == 1.0 and "error" not in r), None
        )
        if run.fraction == 1.0:
            whole = sum(j["images_per_second"] for j in per_job)
        return {**base_row, **figures.share_row(run, per_job, whole), "job_figures": per_job}

    # --- interruption ------------------------------------------------------------
    def _cancel_live(self) -> None:
        """Cancel every job this benchmark started and wait until its supervisor is gone."""
        if self._live:
            self._say(f"interrupted: cancelling {len(self._live)} job(s) ...")
        for job in self._live:
            try:
                job.executor.cancel(job.spec.name)
            except GpupoolError as err:
                self._say(f"cancel {job.spec.name}: {err.message}")
        for job in self._live:
            _wait_supervisor(job.executor)
        self._live = []

    # --- the report ----------------------------------------------------------------
    def _report(self, devices: List[Device], interrupted: bool = False) -> Dict[str, Any]:
        rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in self._rows]
        results = self._any_result()
        used = sorted({d for r in rows for d in r.get("devices", [])})
        names = sorted({d.name for d in devices if any(d.uuid in u for u in used)}) or sorted({d.name for d in devices})
        accel = results.get("gpu_name") or (f"CPU (pool: {', '.join(names)})" if results else ", ".join(names))
        report: Dict[str, Any] = {
            "kind": self.kind.value,
            "settings": self.settings.to_dict(),
            "machine": {
                "accelerator": accel,
                "device": results.get("device"),
                "pool_devices": [d.to_dict() for d in devices],
                "amp": results.get("amp"),
                "channels_last": results.get("channels_last"),
                "threads_per_worker": results.get("threads"),
                "torch": results.get("torch"),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
            },
            "runs": rows,
            "jobs_prefix": self.prefix,
        }
        if self.kind is Kind.SCALING:
            report["baseline_gpus"] = next((r["gpus"] for r in rows if "error" not in r), None)
        if interrupted:
            report["interrupted"] = True
        return report

    def _any_result(self) -> Dict[str, Any]:
        for path in sorted(self.out.glob("runs/*/result-*.json")):
            try:
                return dict(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return {}


def _bar(total: int, title: str) -> Any:
    from tqdm import tqdm

    # A terminal that reports no width (0 columns under some ptys) would get an empty bar.
    width = shutil.get_terminal_size((100, 24)).columns or 100
    return tqdm(total=total, desc=title, file=sys.stderr, ncols=max(60, width), leave=True, unit="step")


def _summary(row: Dict[str, Any]) -> str:
    if "error" in row:
        return f"failed: {row['error']}"
    if "efficiency" in row:
        eff = row["efficiency"]
        return (
            f"{row['images_per_second']:,.1f} images/s ({row['images_per_second_per_worker']:,.1f} per GPU"
            + (f", efficiency {eff:.2f}" if eff is not None else "")
            + f"), step p50 {row['step_p50_ms']:.1f} ms, p95 {row['step_p95_ms']:.1f} ms"
        )
    ratio = row["aggregate_vs_whole"]
    return (
        f"{row['images_per_second']:,.1f} images/s from {row['jobs']} job(s)"
        + (f" = {ratio:.2f} x one whole-GPU job" if ratio is not None else "")
        + f", per job {', '.join(f'{x:,.1f}' for x in row['per_job_images_per_second'])}"
        + (f", fairness {row['fairness']:.2f}" if row["fairness"] is not None else "")
    )


def _log_tail(job: _Job, lines: int = 3) -> str:
    try:
        tail = list(job.executor.log_lines(job.spec.name))[-lines:]
    except GpupoolError:
        return ""
    return (" | last log lines: " + " / ".join(t.strip() for t in tail if t.strip())) if tail else ""


def _reap(executor: LocalExecutor) -> None:
    """Collect our exited supervisor child, so `alive()` and the OS both see it gone."""
    if executor.supervisor is not None:
        executor.supervisor.poll()


def _wait_supervisor(executor: LocalExecutor) -> None:
    """The supervisor frees the lease and stops the replicas before it exits: wait for that."""
    proc = executor.supervisor
    if proc is None:
        return
    try:
        proc.wait(SUPERVISOR_EXIT_S)
    except Exception:  # hung: cancel's own clean-up path (kill, sweep, release) takes over
        for name in [s.name for s in executor.store.all() if s.supervisor_pid == proc.pid]:
            executor.cancel(name)
        proc.wait(5)
