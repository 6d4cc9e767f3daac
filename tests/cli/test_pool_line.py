"""Every client verb's human output starts with the pool it read (`pool: embedded /dir`,
`pool: https://host:port`, `pools: a, b`); --json and --csv stay as they were. Through real
subprocesses, on an embedded pool and against a real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import httpx
import pytest
from envs import embedded_env
from gpupool_cli import gpupool

from gpupool.workload.client.resolve import pool_line

DEVICES = "emulated:2x16GiB"


def first(text: str) -> str:
    return text.splitlines()[0] if text else ""


@pytest.fixture
def embedded(tmp_path: Path) -> Dict[str, str]:
    """The env of a user with an embedded pool in tmp_path/state and no config."""
    return embedded_env(tmp_path, DEVICES)


def test_the_line_names_one_pool_or_several():
    assert pool_line(["embedded:/var/lib/gpupool"]) == "pool: embedded /var/lib/gpupool"
    assert pool_line(["https://gpu1:56001"]) == "pool: https://gpu1:56001"
    assert pool_line(["https://a:1", "embedded:/s"]) == "pools: https://a:1, embedded /s"


# (verb's argv, the stream its human output goes to); each reads or changes the embedded pool.
EMBEDDED_VERBS: List[tuple] = [
    (["status"], "stdout"),
    (["list-gpus"], "stdout"),
    (["usage"], "stdout"),
    (["usage", "--by", "lease"], "stdout"),
    (["queue", "list"], "stdout"),
    (["queue", "set", "team-a", "--quota", "1"], "stderr"),
    (["doctor"], "stdout"),
    (["jobs"], "stdout"),
    (["token", "list", "--state", "{state}"], "stdout"),
    (["run", "--", "true"], "stderr"),
]


@pytest.mark.parametrize("argv, stream", EMBEDDED_VERBS, ids=[" ".join(a) for a, _ in EMBEDDED_VERBS])
def test_each_verb_starts_with_the_embedded_pool(embedded, argv, stream):
    state = embedded["GPUPOOL_STATE"]
    gpupool("list-gpus", env=embedded, check=True)  # the pool exists (doctor refuses a folder that never held one)
    done = gpupool(*[a.format(state=state) for a in argv], env=embedded, check=True)
    line = first(getattr(done, stream))
    # the runner's lines carry its prefix: the command's own output shares the stream
    expected = f"pool: embedded {state}"
    assert line == (f"gpupool: {expected}" if argv[0] == "run" else expected), getattr(done, stream)


@pytest.mark.parametrize("argv", [["status", "--json"], ["usage", "--json"], ["queue", "list", "--json"]])
def test_machine_output_is_unchanged(embedded, argv):
    done = gpupool(*argv, env=embedded, check=True)
    assert isinstance(json.loads(done.stdout), dict) and "pool:" not in done.stdout
    csv_done = gpupool("usage", "--csv", env=embedded, check=True)
    assert first(csv_done.stdout) == "key,gpu_hours,gpu_seconds,leases"


def test_a_relative_state_dir_is_named_in_full(embedded, tmp_path):
    done = gpupool("status", "--state", "rel", env=embedded, cwd=tmp_path, check=True)
    assert first(done.stdout) == f"pool: embedded {tmp_path / 'rel'}"


def test_the_server_named_by_flag_env_or_config_is_the_one_shown(running_server, tmp_path):
    env = running_server.client_env(tmp_path)
    url = running_server.url
    assert first(gpupool("status", "--server", url, env=env, check=True).stdout) == f"pool: {url}"
    assert first(gpupool("usage", env=dict(env, GPUPOOL_SERVER=url), check=True).stdout) == f"pool: {url}"
    assert first(gpupool("queue", "list", "--server", url, env=env, check=True).stdout) == f"pool: {url}"
    # a queue changed on the server: the confirmation on stderr names it first
    done = gpupool("queue", "set", "team-a", "--quota", "1", "--server", url, env=env, check=True)
    assert first(done.stderr) == f"pool: {url}" and "queue team-a" in done.stderr
    # --state beats $GPUPOOL_SERVER, and the line says so
    local = tmp_path / "local"
    shown = gpupool(
        "status", "--state", str(local), env=dict(env, GPUPOOL_SERVER=url, GPUPOOL_DEVICES=DEVICES), check=True
    )
    assert first(shown.stdout) == f"pool: embedded {local}"


def test_several_pools_are_named_in_one_line(running_server, tmp_path):
    env = dict(running_server.client_env(tmp_path), GPUPOOL_DEVICES=DEVICES)
    url, local = running_server.url, tmp_path / "local"
    done = gpupool("status", "--server", url, "--server", f"embedded:{local}", env=env, check=True)
    assert first(done.stdout) == f"pools: {url}, embedded {local}"
    ran = gpupool("run", "--server", url, "--server", f"embedded:{local}", "--", "true", env=env, check=True)
    assert first(ran.stderr) == f"gpupool: pools: {url}, embedded {local}"


def test_admin_verbs_against_a_server_name_it(running_server, tmp_path):
    env = running_server.client_env(tmp_path)
    url = running_server.url
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(running_server.token or "")
    listed = gpupool("token", "list", "--server", url, "--admin-token-file", str(admin_file), env=env, check=True)
    assert first(listed.stdout) == f"pool: {url}"
    assert first(gpupool("doctor", "--server", url, env=env, check=True).stdout) == f"pool: {url}"
    lease = httpx.post(
        f"{url}/v1/leases",
        json={"claim": {"requests": [{"count": 1, "fraction": 0.5}]}},
        headers=running_server.headers(),
    ).json()
    released = gpupool("release", lease["id"], "--server", url, env=env, check=True)
    assert released.stderr.splitlines() == [f"pool: {url}", f"gpupool: released lease {lease['id']}"]


def test_job_verbs_name_the_state_dirs_pool(embedded, tmp_path):
    """submit, jobs, logs and cancel of a local job: the pool of the state dir its gang claims from;
    the log lines on stdout stay the job's own."""
    import yaml
    from waiting import wait_until

    state = embedded["GPUPOOL_STATE"]
    spec = {
        "name": "hello",
        "roles": {"worker": {"replicas": 1, "command": ["python", "-c", "print('hi')"], "gpu": {"fraction": 0.5}}},
    }
    path = tmp_path / "hello.yaml"
    path.write_text(yaml.safe_dump(spec))
    submitted = gpupool("submit", str(path), env=embedded, check=True)
    assert first(submitted.stderr) == f"pool: embedded {state}"
    wait_until(lambda: "Succeeded" in gpupool("jobs", env=embedded, check=True).stdout, 60.0, "the job ends")
    assert first(gpupool("jobs", env=embedded, check=True).stdout) == f"pool: embedded {state}"
    logs = gpupool("logs", "hello", env=embedded, check=True)
    assert (
        first(logs.stderr) == f"pool: embedded {state}" and "pool: embedded" not in logs.stdout and "hi" in logs.stdout
    )
    assert first(gpupool("cancel", "hello", env=embedded, check=True).stderr) == f"pool: embedded {state}"


def test_config_show_names_the_pool_as_the_verbs_do(embedded, running_server, tmp_path):
    shown = gpupool("config", "show", env=embedded, check=True)
    assert first(shown.stdout) == f"pool: embedded {embedded['GPUPOOL_STATE']}  (from $GPUPOOL_STATE)"
    env = running_server.client_env(tmp_path)
    remote = gpupool("config", "show", "--server", running_server.url, env=env, check=True)
    assert first(remote.stdout) == f"pool: {running_server.url}  (from --server)"
    assert (
        first(gpupool("status", "--server", running_server.url, env=env, check=True).stdout)
        == f"pool: {running_server.url}"
    )
