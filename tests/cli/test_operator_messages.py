"""Issue 25, item 5: a closed stdout ends a verb quietly; `doctor` on a folder that never held a
pool says so (not found), instead of calling it damaged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from envs import clean_env
from waiting import wait_until


def test_a_reader_that_went_away_ends_the_verb_quietly_as_sigpipe_would(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # `gpupool list-gpus | head -0`: nobody reads
    try:
        args = [sys.executable, "-m", "gpupool", "list-gpus", "--state", str(tmp_path / "s")]
        done = subprocess.run(
            [*args, "--devices", "emulated:2x16GiB"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=clean_env(tmp_path),
        )
    finally:
        os.close(write)
    assert done.returncode == 128 + signal.SIGPIPE and done.stderr == ""


def test_doctor_on_a_folder_without_a_pool_says_not_found(tmp_path: Path) -> None:
    typo = tmp_path / "no-such-pool"
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "doctor", "--state", str(typo)],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(tmp_path),
    )
    assert done.returncode == 4, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert str(typo) in line and "holds no pool" in line and "--state" in line
    assert not typo.exists(), "doctor only reads: it made no folder"


def test_no_room_advice_is_given_once_and_not_to_a_claim_that_waits(tmp_path: Path) -> None:
    env = dict(clean_env(tmp_path), GPUPOOL_DEVICES="emulated:1x16GiB")
    state = ["--state", str(tmp_path / "s")]
    marker = tmp_path / "held"
    hold = (
        f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(600)"  # held until the test kills it
    )
    holder = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "run", *state, "-p", "1", "--", sys.executable, "-c", hold],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(marker.exists, 60, "the first run's command")
        refused = subprocess.run(
            [sys.executable, "-m", "gpupool", "run", *state, "-p", "1", "--", "true"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert refused.returncode == 3 and refused.stderr.count("--wait") == 1, refused.stderr
        waiting = subprocess.run(
            [sys.executable, "-m", "gpupool", "run", *state, "-p", "1", "--wait", "0.5", "--", "true"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        line = next(x for x in waiting.stderr.splitlines() if "Waiting up to" in x)
        assert "wait for it" not in line and "--wait" not in line, line
    finally:
        holder.kill()
        holder.wait()


def test_status_watch_redraws_until_interrupted(tmp_path: Path) -> None:
    env = dict(clean_env(tmp_path), GPUPOOL_DEVICES="emulated:1x16GiB")
    args = [sys.executable, "-m", "gpupool", "status", "--watch", "0.2", "--state", str(tmp_path / "s")]
    # Ctrl-C as a terminal sends it: SIGINT at its default (a backgrounded test run inherits it ignored)
    default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    watch = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint
    )
    lines: list = []
    assert watch.stdout is not None
    for line in watch.stdout:  # a frame starts with a '--- HH:MM:SS' line when stdout is no terminal
        lines.append(line)
        if sum(x.startswith("--- ") for x in lines) >= 3:
            break
    watch.send_signal(signal.SIGINT)
    _, err = watch.communicate(timeout=30)
    assert watch.returncode == 0 and "Traceback" not in err, err
    assert sum("GPU-emu" in x for x in lines) >= 2, "every frame shows the devices"
    bad = subprocess.run([*args[:4], "--watch", "0", *args[6:]], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--watch 0 must be between" in bad.stderr
