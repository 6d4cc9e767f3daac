"""Issue 34 item 5: the watchdog's log lines say what the kernel says about a process (its pid and
uid) and mark the lease holder's pid as the client's word, never as the process's owner."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from envs import write_usage
from waiting import wait_until

from gpupool.pooling.devices.usage import EMULATED_USAGE_ENV
from gpupool.pooling.isolation.proctree import alive

CLI = [sys.executable, "-m", "gpupool.cli.workload"]
HOLDER = str(Path(__file__).resolve().parents[2] / "workload" / "runner" / "holder.py")
OTHER_UID = 60002  # a stranger's process on the GPU
GIB = 1024


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process of another local user: needs root")
def test_watchdog_lines_give_the_kernels_facts_and_mark_the_clients_word(server_factory, tmp_path, monkeypatch):
    usage = tmp_path / "usage.json"
    write_usage(usage, {})
    monkeypatch.setenv(EMULATED_USAGE_ENV, str(usage))
    server = server_factory("--enforce-grace", "0.5", "--usage-interval", "0.2", "--enforce", "kill")
    record = tmp_path / "child.json"
    runner = subprocess.Popen(
        [*CLI, "run", "--server", server.url, "-p", "0.25", "--ttl", "30", "--", sys.executable, HOLDER]
        + [str(record), str(tmp_path / "never")],
        env=server.client_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    drop = f"import os, time; os.setgroups([]); os.setgid({OTHER_UID}); os.setuid({OTHER_UID}); time.sleep(120)"
    stranger = subprocess.Popen([sys.executable, "-c", drop])
    try:
        wait_until(lambda: record.exists() or runner.poll() is not None, 30, "the command to start")
        assert record.exists(), runner.stderr.read() if runner.stderr else runner.returncode
        child = json.loads(record.read_text())["pid"]
        wait_until(lambda: os.stat(f"/proc/{stranger.pid}").st_uid == OTHER_UID, 10, "the stranger to be another user")
        uuid = "GPU-emu-vm-0"
        # The command over its 4 GiB share (killed), a stranger's process on the same GPU (warned about).
        write_usage(usage, {uuid: {str(child): 5 * GIB, str(stranger.pid): 512}})
        wait_until(lambda: not alive(child), 20, "the over-share command to be killed")

        def lines() -> list:
            return [line for line in server.log.read_text().splitlines() if " watchdog " in line]

        killed = wait_until(lambda: [line for line in lines() if f"killed pid {child} " in line], 10, "the kill line")
        warned = wait_until(lambda: [ln for ln in lines() if f"about pid {stranger.pid} " in ln], 10, "the warn line")
        line = killed[0]
        # The kernel's word: the process and its owner.
        assert f"pid {child} runs as uid {os.geteuid()} (the kernel's word)" in line, line
        # The client's word, said as such: the holder pid is the runner's, as `gpupool run` sent it.
        assert f"(holder pid {runner.pid}, host " in line and "as the client says)" in line, line
        assert not re.search(rf"@\S*:{runner.pid}\b", line), line  # no more 'admin@host:PID'
        assert f"pid {stranger.pid} runs as uid {OTHER_UID} (the kernel's word)" in warned[0], warned[0]
        assert runner.wait(timeout=30) != 0
    finally:
        for proc in (runner, stranger):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
