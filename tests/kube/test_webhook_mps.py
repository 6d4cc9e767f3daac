"""The mutating webhook in MPS mode: GPU containers get the agent's MPS pipe folder and /dev/shm."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.kube import annotations as ann
from gpupool.kube.mutate import MPS_PIPE_VOLUME, MPS_SHM_VOLUME, MutateConfig, mutate

from .conftest import apply_patch, to_v1pod

PIPE = "/var/lib/gpupool/mps/pipe"
MPS = MutateConfig(mps_pipe_dir=PIPE)


def pod(*containers, volumes=None):
    spec = {"containers": list(containers)}
    if volumes is not None:
        spec["volumes"] = volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}


def gpu(name="train", mounts=None, env=None):
    c = {
        "name": name,
        "image": "pytorch",
        "command": ["python", "train.py"],
        "resources": {"limits": {"gpupool.io/gpu-amount": 1, "gpupool.io/gpu-percent": 50}},
    }
    if mounts is not None:
        c["volumeMounts"] = mounts
    if env is not None:
        c["env"] = env
    return c


def mutated(p, config=MPS):
    out = mutate(p, config)
    patched = apply_patch(p, out.patch)
    to_v1pod(patched)
    assert mutate(patched, config).patch == []  # a second pass is a no-op
    return patched, out.warnings


def test_gpu_containers_get_the_pipe_folder_shm_and_env():
    p, warnings = mutated(pod(gpu(), {"name": "sidecar", "image": "busybox"}))
    train, sidecar = p["spec"]["containers"]
    mounts = {m["name"]: m for m in train["volumeMounts"]}
    assert mounts[MPS_PIPE_VOLUME]["mountPath"] == PIPE  # the same path as on the agent
    assert mounts[MPS_SHM_VOLUME]["mountPath"] == "/dev/shm"
    assert {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": PIPE} in train["env"]
    volumes = {v["name"]: v for v in p["spec"]["volumes"]}
    assert volumes[MPS_PIPE_VOLUME]["hostPath"] == {"path": PIPE, "type": "DirectoryOrCreate"}
    assert volumes[MPS_SHM_VOLUME]["hostPath"] == {"path": "/run/gpupool/mps/shm", "type": "DirectoryOrCreate"}
    assert "volumeMounts" not in sidecar and "env" not in sidecar  # no GPU, no MPS
    assert warnings == []
    pod_model = to_v1pod(p)
    assert pod_model.spec.volumes[-2].host_path.path == PIPE


def test_without_mps_nothing_mps_is_added():
    p, _ = mutated(pod(gpu()), MutateConfig())
    text = repr(p)
    assert "mps" not in text.lower() and "/dev/shm" not in text


def test_an_own_dev_shm_is_kept_with_a_warning():
    shm = {"name": "dshm", "mountPath": "/dev/shm"}
    p, warnings = mutated(pod(gpu(mounts=[shm]), volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory"}}]))
    mounts = p["spec"]["containers"][0]["volumeMounts"]
    assert shm in mounts and not any(m["name"] == MPS_SHM_VOLUME for m in mounts)
    assert any(m["name"] == MPS_PIPE_VOLUME for m in mounts)
    assert any("/dev/shm" in w and "'train'" in w and "remove that volumeMount" in w for w in warnings)


def test_existing_env_and_volumes_are_not_replaced():
    mine = {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/custom"}
    p, _ = mutated(pod(gpu(env=[mine]), volumes=[{"name": MPS_PIPE_VOLUME, "emptyDir": {}}]))
    env = p["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "CUDA_MPS_PIPE_DIRECTORY"] == [mine]
    assert [v for v in p["spec"]["volumes"] if v["name"] == MPS_PIPE_VOLUME] == [
        {"name": MPS_PIPE_VOLUME, "emptyDir": {}}
    ]


def test_injection_only_containers_get_the_pipe_env_too():
    p = pod(gpu())
    p["metadata"]["annotations"] = {ann.INJECT: "injection-only"}
    patched, _ = mutated(p)
    c = patched["spec"]["containers"][0]
    assert c["command"] == ["python", "train.py"]
    assert {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": PIPE} in c["env"]


def test_a_relative_pipe_dir_is_refused_with_the_fix():
    with pytest.raises(InvalidInput, match="--mps-pipe-dir 'mps/pipe' must be an absolute host path"):
        MutateConfig(mps_pipe_dir="mps/pipe")


def test_webhook_cli_refuses_an_unknown_isolation(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpupool",
            "kube",
            "webhook",
            "--listen",
            "127.0.0.1:0",
            "--agents",
            "n1=http://127.0.0.1:1",
            "--isolation",
            "vgpu",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "isolation 'vgpu' is unknown: use mps, hooks or none" in done.stderr
