"""Issue 25: `gpupool run --wait` shows its place and elapsed time while it waits: on a terminal one
line redrawn in place (\\r and erase to the end of the line), elsewhere a plain line only when its
place or reason changes. Real runs on an embedded pool of one emulated GPU; the terminal is a pty."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, List

from envs import clean_env
from gpupool_cli import gpupool_cmd
from waiting import wait_until


def waiting(state: Path, env: Dict[str, str]) -> List[dict]:
    done = subprocess.run(
        gpupool_cmd("queue", "show", "--json", "--state", str(state)), env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["waiting"]


def hold_the_gpu(state: Path, env: Dict[str, str], flags: Path) -> subprocess.Popen:
    """A run that holds the one GPU until `flags/stop` exists."""
    script = f": > {flags}/held; while [ ! -e {flags}/stop ]; do sleep 0.05; done"
    proc = subprocess.Popen(
        gpupool_cmd("run", "-q", "--state", str(state), "-p", "1", "--", "sh", "-c", script), env=env
    )
    wait_until(lambda: (flags / "held").exists(), 30, "the GPU held")
    return proc


def test_on_a_terminal_one_line_is_redrawn_with_the_elapsed_time(tmp_path: Path) -> None:
    state, flags, env = (
        tmp_path / "state",
        tmp_path / "flags",
        clean_env(tmp_path, GPUPOOL_DEVICES="emulated:1x16GiB", PYTHONUNBUFFERED="1"),
    )
    flags.mkdir()
    holder = hold_the_gpu(state, env, flags)
    master, slave = pty.openpty()
    out = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the other side is closed
                return
            if not chunk:
                return
            out.extend(chunk)

    waiter = subprocess.Popen(
        gpupool_cmd("run", "--state", str(state), "--wait", "600", "-p", "1", "--", "true"),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:

        def elapsed_seen() -> set:
            return set(re.findall(rb"\rgpupool: waiting (\d+)s, position 1", bytes(out)))

        wait_until(lambda: len(elapsed_seen()) >= 2, 30, "two redraws with different elapsed times")
    finally:
        (flags / "stop").touch()
        assert waiter.wait(30) == 0
        assert holder.wait(30) == 0
        reader.join(10)
        os.close(master)
    text = bytes(out).decode()
    (line,) = [line for line in text.split("\n") if "gpupool: waiting" in line]  # all redraws on one line
    draws = line.split("\r")
    assert sum("gpupool: waiting" in d for d in draws) >= 2
    assert all(d.endswith("\x1b[K") for d in draws if "gpupool: waiting" in d), draws
    assert "\r\x1b[K" in text  # erased once the claim is granted: what follows starts clean
    assert "Locked 1 GPUs" in text.split("\r\x1b[K", 1)[1]


def test_elsewhere_a_plain_line_only_when_the_place_or_reason_changes(tmp_path: Path) -> None:
    state, flags, env = (
        tmp_path / "state",
        tmp_path / "flags",
        clean_env(tmp_path, GPUPOOL_DEVICES="emulated:1x16GiB", PYTHONUNBUFFERED="1"),
    )
    flags.mkdir()
    holder = hold_the_gpu(state, env, flags)
    first = subprocess.Popen(
        gpupool_cmd("run", "-q", "--state", str(state), "--wait", "600", "-p", "1", "--", "true"),
        env=env,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: len(waiting(state, env)) == 1, 30, "the first claim waiting")
    second = subprocess.Popen(
        gpupool_cmd("run", "--state", str(state), "--wait", "600", "-p", "1", "--", "true"),
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: List[str] = []
    ticket = None
    reader = threading.Thread(target=lambda: lines.extend(iter(second.stderr.readline, "")), daemon=True)
    reader.start()

    def said() -> List[str]:
        return [line for line in list(lines) if line.startswith("gpupool: waiting")]

    try:
        wait_until(lambda: said(), 30, "the second run saying its place")
        assert "position 2" in said()[0]
        (ticket,) = [w["ticket"] for w in waiting(state, env) if w["position"] == 1]
        held = subprocess.run(
            gpupool_cmd("claim", "hold", str(ticket), "--state", str(state)), env=env, capture_output=True, text=True
        )
        assert held.returncode == 0, held.stderr
        wait_until(lambda: len(said()) == 2, 30, "a new line for the new place")
        assert "position 1" in said()[1]
        quiet_since = time.monotonic()
        wait_until(lambda: time.monotonic() - quiet_since > 2.5, 10, "three more polls of an unchanged place")
        assert len(said()) == 2  # the place and reason stayed: no more lines
    finally:
        (flags / "stop").touch()
        assert holder.wait(30) == 0
        assert second.wait(30) == 0  # granted past the held claim
        if ticket is None:  # the test failed before holding it: nothing would grant it now
            first.kill()
        else:
            subprocess.run(
                gpupool_cmd("claim", "release", str(ticket), "--state", str(state)), env=env, capture_output=True
            )
        assert first.wait(30) == (0 if ticket is not None else -9)
        reader.join(10)
    assert not any("\r" in line or "\x1b" in line for line in lines)


def test_against_a_server_the_place_is_asked_beside_the_waiting_claim(running_server, tmp_path: Path) -> None:
    """The claim's request is held by the server while it waits: the place is asked on another connection."""
    server = running_server
    env = server.client_env(tmp_path)
    flags = tmp_path / "flags"
    flags.mkdir()
    script = f": > {flags}/held; while [ ! -e {flags}/stop ]; do sleep 0.05; done"
    holder = subprocess.Popen(
        gpupool_cmd("run", "-q", "--server", server.url, "-n", "2", "-p", "1", "--", "sh", "-c", script), env=env
    )
    wait_until(lambda: (flags / "held").exists(), 30, "both GPUs held")
    waiter = subprocess.Popen(
        gpupool_cmd("run", "--server", server.url, "--wait", "600", "-p", "0.5", "--", "true"),
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: List[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(waiter.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any(line.startswith("gpupool: waiting") for line in list(lines)), 30, "its place said")
    finally:
        (flags / "stop").touch()
        assert holder.wait(30) == 0
        assert waiter.wait(30) == 0
        reader.join(10)
    (said,) = [line for line in lines if line.startswith("gpupool: waiting")]
    assert "position 1" in said and "no room" in said
