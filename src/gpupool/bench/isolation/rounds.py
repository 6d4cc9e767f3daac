"""Run the isolation rounds through the pool: each probe is a lease's command under `gpupool run`.

Every probe runs as `gpupool run -n 1 -p SHARE --isolation MODE -- python -m
gpupool.bench.isolation.probe ...` on an embedded pool, one state dir per mode, so the lease's
contract (CUDA_MPS_* in `mps`, the framework caps in `hooks`) is exactly what a user's job gets.
A round starts its probes one after the other, each once the one before is warm (its ready file),
measures for the round's window, then asks them all to stop through a stop file. A probe that is
not gone STOP_GRACE_S later is ended with its runner's process group, so nothing outlives a round.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.isolation_mode import IsolationMode
from ...workload.runner.prctl import parent_death_signal
from . import figures
from .probe import IMAGE_SIZE, INTERVAL_S, MATMUL_SIZE, MODEL, READY_SUFFIX, TRAIN_BATCH

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

READY_TIMEOUT_S = 300.0
STOP_GRACE_S = 60.0
# After the first probe of a split is warm, it runs alone this long: its rate alone, before the second.
ALONE_LEAD_S = 3.0
# A probe's own time limit, past any round's windows: the stop file (or the harness's end) stops it first.
PROBE_LIMIT_S = 4 * 3600.0


class ProbeFailed(RuntimeError):
    """A probe ended before it was ready, or wrote no samples: the message has its runner's last lines."""


@dataclass
class Settings:
    """What every round shares: where it writes, which device, and the probes' sizes."""

    out: Path
    device: str = "cuda"
    matmul_size: int = MATMUL_SIZE
    model: str = MODEL
    image_size: int = IMAGE_SIZE
    train_batch: int = TRAIN_BATCH
    interval_s: float = INTERVAL_S
    ttl_s: float = 30.0
    python: str = sys.executable
    progress: Callable[[str], None] = field(default=lambda text: None)

    def state_dir(self, mode: IsolationMode) -> Path:
        return self.out / "state" / mode.value


@dataclass
class Probe:
    name: str
    proc: subprocess.Popen[bytes]
    out: Path
    log: Path

    @property
    def ready_file(self) -> Path:
        return self.out.with_name(self.out.name + READY_SUFFIX)

    def tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise ProbeFailed(f"probe {self.name} exited {self.proc.returncode} before it was ready: {self.tail()}")
            if time.monotonic() > deadline:
                raise ProbeFailed(f"probe {self.name} was not ready after {timeout_s:g} s: {self.tail()}")
            time.sleep(0.05)

    def samples(self) -> List[Tuple[float, float]]:
        try:
            data = json.loads(self.out.read_text())
        except (OSError, ValueError):
            raise ProbeFailed(
                f"probe {self.name} wrote no samples (exit {self.proc.returncode}): {self.tail()}"
            ) from None
        return [(float(t), float(v)) for t, v in data["samples"]]


class Round:
    """One round's probes: started in order, stopped together, never left behind."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.settings = settings
        self.name = name
        self.dir = settings.out / "rounds" / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stop_file = self.dir / "stop"
        self.stop_file.unlink(missing_ok=True)
        self.probes: List[Probe] = []

    def __enter__(self) -> Round:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, name: str, kind: str, share: float, mode: IsolationMode, run_flags: Sequence[str] = ()) -> Probe:
        s = self.settings
        out = self.dir / f"{name}.json"
        for stale in (out, out.with_name(out.name + READY_SUFFIX)):
            stale.unlink(missing_ok=True)
        probe_args = [
            s.python, "-m", "gpupool.bench.isolation.probe", kind, "--out", str(out), "--stop-file",
            str(self.stop_file), "--seconds", f"{PROBE_LIMIT_S:g}", "--device", s.device, "--size", str(s.matmul_size), "--model", s.model,
            "--image-size", str(s.image_size), "--batch-size", str(s.train_batch), "--interval-s", str(s.interval_s),
        ]  # fmt: skip
        command = [
            s.python, "-m", "gpupool", "run", "-n", "1", "-p", f"{share:g}", "--isolation", mode.value,
            "--ttl", f"{s.ttl_s:g}", "-q", *run_flags, "--", *probe_args,
        ]  # fmt: skip
        run_env = dict(os.environ, GPUPOOL_STATE=str(s.state_dir(mode)))
        log = self.dir / f"{name}.log"
        with open(log, "w") as sink:
            proc = subprocess.Popen(
                command, env=run_env, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
                # The harness killed (even by SIGKILL): each runner ends its probe and releases its lease.
                preexec_fn=parent_death_signal(signal.SIGTERM),
            )  # fmt: skip
        probe = Probe(name, proc, out, log)
        self.probes.append(probe)
        s.progress(f"{self.name}: {name} ({kind}, share {share:g}, {mode.value}) started")
        return probe

    def stop(self) -> None:
        """Ask every probe to stop; end the process group of any still there STOP_GRACE_S later."""
        self.stop_file.touch()
        deadline = time.monotonic() + STOP_GRACE_S
        for probe in self.probes:
            try:
                probe.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # SIGTERM lets the runner end its command's tree and release the lease first.
                _signal_group(probe.proc, signal.SIGTERM)
                try:
                    probe.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    _signal_group(probe.proc, signal.SIGKILL)
                    probe.proc.wait()

    def measure(self, seconds: float) -> None:
        """Let the probes run together for `seconds`, failing at once if one of them ends."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for probe in self.probes:
                if probe.proc.poll() is not None:
                    raise ProbeFailed(
                        f"probe {probe.name} exited {probe.proc.returncode} during the window: {probe.tail()}"
                    )
            time.sleep(0.1)


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


def split_round(settings: Settings, mode: IsolationMode, first: float, second: float, seconds: float) -> Dict[str, Any]:
    """Two matmul probes with shares `first` then `second`; the delivered ratio over `seconds`."""
    name = f"split-{mode.value}-{first:g}-{second:g}"
    with Round(settings, name) as rnd:
        a = rnd.start("first", "matmul", first, mode)
        a.wait_ready()
        time.sleep(ALONE_LEAD_S)
        b = rnd.start("second", "matmul", second, mode)
        b.wait_ready()
        rnd.measure(seconds)
    row = figures.split(a.samples(), b.samples(), first, second)
    return dict(row, mode=mode.value)


def alone_round(
    settings: Settings, mode: IsolationMode, kind: str, share: float, seconds: float, tag: str = ""
) -> List[Tuple[float, float]]:
    """One probe by itself under a lease of `share`; its samples."""
    with Round(settings, f"alone-{kind}-{mode.value}-{share:g}{tag}") as rnd:
        probe = rnd.start("alone", kind, share, mode)
        probe.wait_ready()
        rnd.measure(seconds)
    return probe.samples()


@dataclass(frozen=True)
class NeighbourSetup:
    """How the latency-sensitive lease and the trainer share the GPU in one neighbour round."""

    name: str
    mode: IsolationMode
    inference_share: float
    trainer_share: float
    # `gpupool run` flags of the inference lease (--latency-sensitive).
    inference_flags: Tuple[str, ...] = ()


def neighbour_setups(inference_share: float, modes: Sequence[IsolationMode]) -> List[NeighbourSetup]:
    """The setups gpupool offers a latency-sensitive lease in `modes`: time-sliced, MPS thread %, MPS + priority."""
    trainer = round(1 - inference_share, 4)
    every = [
        NeighbourSetup("time-sliced (hooks)", IsolationMode.HOOKS, inference_share, trainer),
        NeighbourSetup("mps thread %", IsolationMode.MPS, inference_share, trainer),
        NeighbourSetup(
            "mps thread % + --latency-sensitive", IsolationMode.MPS, inference_share, trainer, ("--latency-sensitive",)
        ),
    ]
    return [s for s in every if s.mode in modes]


def neighbour_round(
    settings: Settings, setup: NeighbourSetup, seconds: float, alone: Mapping[str, Any]
) -> Dict[str, Any]:
    """The trainer first, then the inference probe beside it; against each alone (same mode and share)."""
    slug = setup.name.split(" ")[0] + ("-latency-sensitive" if setup.inference_flags else "")
    with Round(settings, f"neighbour-{slug}") as rnd:
        trainer = rnd.start("trainer", "train", setup.trainer_share, setup.mode)
        trainer.wait_ready()
        inference = rnd.start("inference", "infer", setup.inference_share, setup.mode, setup.inference_flags)
        inference.wait_ready()
        rnd.measure(seconds)
    row = figures.neighbour(
        alone[f"infer-{setup.mode.value}"], alone[f"train-{setup.mode.value}"], inference.samples(), trainer.samples()
    )
    return dict(row, setup=setup.name, mode=setup.mode.value, shares=[setup.inference_share, setup.trainer_share])


def stop_mps(settings: Settings) -> None:
    """End the detached MPS daemon that `--isolation mps` started for the rounds' state dir."""
    from ...pooling.isolation.mps import stop_detached

    try:
        stop_detached(settings.state_dir(IsolationMode.MPS))
    except Exception as err:  # a daemon already gone (or no MPS here) is what we want
        settings.progress(f"stopping the MPS daemon: {err}")


def run_splits(
    settings: Settings,
    modes: Sequence[IsolationMode],
    pairs: Sequence[Tuple[float, float]],
    seconds: float,
    alone_s: float,
    save: Callable[[Dict[str, Any]], None] = lambda body: None,
) -> Dict[str, Any]:
    """Compute splits per mode, and one matmul alone at a 25 % share against the whole GPU; `save` after each row."""
    out: Dict[str, Any] = {"splits": [], "alone": []}
    for mode in modes:
        whole = figures.alone(alone_round(settings, mode, "matmul", 1.0, alone_s))
        quarter = figures.alone(alone_round(settings, mode, "matmul", 0.25, alone_s), whole["rate"])
        out["alone"].append(dict(quarter, mode=mode.value, share=0.25, whole_gpu_rate=whole["rate"]))
        save(out)
        settings.progress(f"alone at 0.25 in {mode.value}: {quarter.get('of_whole_gpu')} of the whole GPU")
        for first, second in pairs:
            row = split_round(settings, mode, first, second, seconds)
            out["splits"].append(row)
            save(out)
            settings.progress(
                f"split {first:g}/{second:g} in {mode.value}: asked 1:{row['asked_ratio']:g}, "
                f"delivered 1:{row['delivered_ratio']:g} ({row['error']:+.1%}), settled in {row['settle_s']} s"
            )
    return out


def run_neighbour(
    settings: Settings,
    modes: Sequence[IsolationMode],
    inference_share: float,
    seconds: float,
    alone_s: float,
    save: Callable[[Dict[str, Any]], None] = lambda body: None,
) -> Dict[str, Any]:
    """The latency-sensitive neighbour, in each setup, against the same probes alone."""
    setups = neighbour_setups(inference_share, modes)
    # Hooks (no MPS) first: the MPS rounds start the pool's MPS daemon.
    whole_infer = alone_round(settings, IsolationMode.HOOKS, "infer", 1.0, alone_s, tag="-whole")
    alone: Dict[str, Any] = {}
    for mode in dict.fromkeys(s.mode for s in setups):
        alone[f"infer-{mode.value}"] = alone_round(settings, mode, "infer", inference_share, alone_s)
        alone[f"train-{mode.value}"] = alone_round(settings, mode, "train", round(1 - inference_share, 4), alone_s)
    rows: List[Dict[str, Any]] = []
    for setup in setups:
        row = neighbour_round(settings, setup, seconds, alone)
        rows.append(row)
        save({"inference_alone_whole_gpu": figures.latencies(whole_infer), "setups": rows})
        settings.progress(
            f"neighbour, {setup.name}: p99 {row['inference_beside']['p99_ms']} ms = {row['p99_vs_alone']}x alone, "
            f"trainer kept {row['trainer_kept']:.0%}"
        )
    return {"inference_alone_whole_gpu": figures.latencies(whole_infer), "setups": rows}
