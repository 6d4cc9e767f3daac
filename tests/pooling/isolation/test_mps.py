"""MPS daemon supervision against a stand-in `nvidia-cuda-mps-control` (real processes, a UNIX socket)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import List

import pytest
from waiting import wait_until

from gpupool.core.errors import Unavailable
from gpupool.core.isolation_mode import IsolationMode
from gpupool.pooling.isolation import mps
from gpupool.pooling.isolation.mps import MPS_CONTROL, MpsDaemon, MpsUnavailable, ensure_detached, stop_detached
from gpupool.pooling.isolation.proctree import alive


def daemons(record: Path) -> List[dict]:
    return [dict(json.loads(p.read_text()), pid=int(p.stem)) for p in sorted(record.glob("*.json"))]


def test_start_and_stop_leave_no_process(fake_mps, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_SERVER", "1")
    daemon = MpsDaemon(tmp_path / "state")
    isolation = daemon.start()
    assert isolation.mode is IsolationMode.MPS
    assert isolation.mps_pipe_dir == str(tmp_path / "state" / "mps" / "pipe")
    assert isolation.mps_log_dir == str(tmp_path / "state" / "mps" / "log")
    assert Path(isolation.mps_pipe_dir).is_dir() and Path(isolation.mps_log_dir).is_dir()
    assert daemon.start() == isolation  # idempotent
    [seen] = daemons(fake_mps)
    assert seen["argv"] == ["-f"]
    assert seen["env"]["CUDA_MPS_PIPE_DIRECTORY"] == isolation.mps_pipe_dir
    assert seen["env"]["CUDA_MPS_LOG_DIRECTORY"] == isolation.mps_log_dir
    assert "CUDA_VISIBLE_DEVICES" not in seen["env"]
    server = int((fake_mps / f"server-{seen['pid']}.pid").read_text())
    assert alive(seen["pid"]) and alive(server)
    daemon.stop()
    assert not alive(seen["pid"]) and wait_until(lambda: not alive(server))
    assert not (Path(isolation.mps_pipe_dir) / "control").exists()  # it quit, it was not killed
    daemon.stop()  # idempotent


def test_a_killed_daemon_is_restarted(fake_mps, tmp_path):
    with MpsDaemon(tmp_path / "state") as daemon:
        first = daemon.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert wait_until(lambda: daemon.pid not in (None, first))
        assert daemon.restarts == 1
        assert wait_until(lambda: mps.answers(daemon.pipe_dir, daemon.log_dir))  # the new one serves
        second = daemon.pid
    assert second is not None and not alive(second)


def test_stop_after_kill_9_ends_cleanly(fake_mps, tmp_path, monkeypatch):
    monkeypatch.setattr(mps, "BACKOFF_START_S", 30.0)  # stop() comes while the supervisor waits
    daemon = MpsDaemon(tmp_path / "state")
    daemon.start()
    pid = daemon.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not alive(pid))
    started = time.monotonic()
    daemon.stop()
    assert time.monotonic() - started < 20  # not held by the supervisor's 30 s backoff
    assert daemon.pid is None and len(daemons(fake_mps)) == 1


def test_a_daemon_that_ignores_quit_is_terminated(fake_mps, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_IGNORE_QUIT", "1")
    daemon = MpsDaemon(tmp_path / "state", quit_s=0.5)
    daemon.start()
    pid = daemon.pid
    daemon.stop()
    assert pid is not None and not alive(pid)


def test_missing_binary_is_mps_unavailable_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MpsUnavailable) as err:
        MpsDaemon(tmp_path / "state").start()
    message = err.value.message
    assert MPS_CONTROL in message and "--isolation hooks" in message and "NVIDIA driver utilities" in message
    assert "\n" not in message and err.value.exit_code == 2
    with pytest.raises(MpsUnavailable):
        ensure_detached(tmp_path / "state")


def test_a_daemon_that_dies_at_start_is_reported(fake_mps, tmp_path):
    bad = tmp_path / "bin" / "broken-mps-control"
    bad.write_text("#!/bin/sh\necho 'cannot open device' >&2\nexit 7\n")
    bad.chmod(0o755)
    with pytest.raises(Unavailable, match="exited with 7 at start"):
        MpsDaemon(tmp_path / "state", binary=str(bad)).start()


def test_second_daemon_on_the_same_folder_is_refused(fake_mps, tmp_path):
    with MpsDaemon(tmp_path / "state"), pytest.raises(Unavailable, match="already answers"):
        MpsDaemon(tmp_path / "state").start()


def test_ensure_detached_starts_once_and_stays_until_stopped(fake_mps, tmp_path):
    state = tmp_path / "state"
    isolation = ensure_detached(state)
    assert isolation.mode is IsolationMode.MPS and isolation.mps_pipe_dir == str(state / "mps" / "pipe")
    assert ensure_detached(state) == isolation  # answers already: no second daemon
    [seen] = daemons(fake_mps)
    assert alive(seen["pid"])  # outlives the call that started it
    assert stop_detached(state) is True
    assert wait_until(lambda: not alive(seen["pid"]))
    assert stop_detached(state) is False


def test_a_server_killed_with_kill_9_leaves_its_daemon_to_the_next_server(fake_mps, server_factory, tmp_path):
    """The daemon (its own session) outlives a server's kill -9 and keeps serving its clients; the next
    server on the state dir adopts it instead of refusing to start, and ends it when it stops."""
    import httpx

    state = tmp_path / "state"
    first = server_factory("--isolation", "mps", state=state)
    [seen] = daemons(fake_mps)
    first.stop(signal.SIGKILL)
    assert alive(seen["pid"])  # left behind, still serving
    second = server_factory("--isolation", "mps", state=state)
    isolation = httpx.get(f"{second.url}/v1/status", headers=second.headers()).json()["isolation"]
    assert isolation["mode"] == "mps" and len(daemons(fake_mps)) == 1, "adopted, no second daemon"
    assert mps.answers(*mps.mps_dirs(state))
    os.kill(seen["pid"], signal.SIGKILL)  # the adopted one dies: the server starts its own
    assert wait_until(lambda: len(daemons(fake_mps)) == 2 and mps.answers(*mps.mps_dirs(state)), 60, "a new daemon")
    third = max(daemons(fake_mps), key=lambda d: d["pid"] != seen["pid"])["pid"]
    assert second.stop() == 0
    assert wait_until(lambda: not alive(third), 30, "the daemon's end with its server")


def test_a_pid_file_that_names_another_process_adopts_nothing(fake_mps, tmp_path):
    state = tmp_path / "state"
    ensure_detached(state)  # a daemon gpupool run left, not a server's
    pipe, _ = mps.mps_dirs(state)
    (pipe.parent / mps.PID_FILE).write_text(f"{os.getpid()} 1 1 1\n")  # a live pid, not that start time
    with pytest.raises(Unavailable, match="already answers"):
        MpsDaemon(state).start()
    assert stop_detached(state) is True
