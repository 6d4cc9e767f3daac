"""--preempt on `gpupool server`, the node agent and `gpupool queue set` (issue 28, "Who suspends")."""

from __future__ import annotations

import importlib
import json

import pytest
from envs import embedded_env
from gpupool_cli import gpupool

from gpupool.cli.main import main
from gpupool.core.suspension import DEFAULT_PREEMPT_MODE, PREEMPT_KILL, PREEMPT_REQUEUE

from .test_queue_cli import DEVICES


@pytest.mark.parametrize("flags, mode", [([], DEFAULT_PREEMPT_MODE), (["--preempt", PREEMPT_KILL], PREEMPT_KILL)])
def test_server_passes_its_preempt_mode_to_the_pool(monkeypatch, tmp_path, flags, mode):
    serve = importlib.import_module("gpupool.serving.server.serve")  # the package's `serve` is the function
    configs = []
    monkeypatch.setattr(serve, "serve", configs.append)
    assert main(["server", "--state", str(tmp_path), "--devices", "emulated:1x8GiB", *flags]) == 0
    (config,) = configs
    assert config.preempt_mode == mode
    prepared = serve.prepare(
        serve.ServerConfig(listen="127.0.0.1:0", state_dir=str(tmp_path), devices="emulated:1x8GiB", preempt_mode=mode)
    )
    try:
        assert prepared.pool.preempt_mode == mode
    finally:
        prepared.close()


def test_node_agent_passes_its_preempt_mode(monkeypatch):
    from gpupool.kube import agent

    configs = []
    monkeypatch.setattr(agent, "run_agent", configs.append)
    assert main(["kube", "agent", "--preempt", PREEMPT_REQUEUE, "--listen", "127.0.0.1:0", "--no-reap"]) == 0
    assert configs[0].preempt_mode == PREEMPT_REQUEUE


@pytest.mark.parametrize("verb", [["server"], ["queue", "set", "team-a", "--quota", "1"], ["kube", "agent"]])
def test_a_bad_preempt_mode_is_exit_2_naming_the_choices(tmp_path, verb):
    done = gpupool(*verb, "--preempt", "pause", env=embedded_env(tmp_path, DEVICES))
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert "--preempt" in error and "'pause'" in error and "suspend" in error and "requeue" in error, done.stderr
    assert "Traceback" not in done.stderr


def test_queue_set_preempt_is_listed_and_kept(tmp_path):
    env = embedded_env(tmp_path, DEVICES)
    done = gpupool("queue", "set", "team-a", "--quota", "1", "--preempt", PREEMPT_KILL, env=env)
    assert done.returncode == 0 and f"preempt {PREEMPT_KILL}" in done.stderr, done.stderr
    assert gpupool("queue", "set", "team-b", "--quota", "0.5", env=env).returncode == 0
    listed = json.loads(gpupool("queue", "list", "--json", env=env).stdout)["queues"]
    assert [(q["name"], q["preempt"]) for q in listed] == [("team-a", PREEMPT_KILL), ("team-b", "")]
    lines = gpupool("queue", "list", env=env).stdout.splitlines()
    assert lines[0] == f"pool: embedded {env['GPUPOOL_STATE']}"
    header = lines[1].split()
    at = header.index("PREEMPT")
    # the mode in force (issue 36 item 2): team-b's is the pool's, suspend by default
    assert [line.split()[at] for line in lines[2:]] == [PREEMPT_KILL, "suspend"]
    assert [q["preempt_in_force"] for q in listed] == [PREEMPT_KILL, "suspend"]
    # `set` replaces the queue: without --preempt it follows the pool's mode again.
    assert gpupool("queue", "set", "team-a", "--quota", "1", env=env).returncode == 0
    assert json.loads(gpupool("queue", "list", "--json", env=env).stdout)["queues"][0]["preempt"] == ""


def test_queue_set_preempt_against_a_server(running_server, tmp_path):
    s = running_server
    env = s.client_env(tmp_path)
    done = gpupool("queue", "set", "team-p", "--quota", "1", "--preempt", PREEMPT_REQUEUE, "--server", s.url, env=env)
    assert done.returncode == 0 and f"preempt {PREEMPT_REQUEUE}" in done.stderr, done.stderr
    listed = json.loads(gpupool("queue", "list", "--json", "--server", s.url, env=env).stdout)["queues"]
    assert {q["name"]: q["preempt"] for q in listed}["team-p"] == PREEMPT_REQUEUE
    assert PREEMPT_REQUEUE in gpupool("queue", "list", "--server", s.url, env=env).stdout
