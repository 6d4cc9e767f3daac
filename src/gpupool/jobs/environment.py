"""The env each replica gets, and Kubernetes-style `$(VAR)` expansion of its command.

Order matters: the spec's env first, then gpupool's own variables, the GPU
share and last the rendezvous variables, because a user value for RANK or
TF_CONFIG would silently break the rendezvous every other replica relies on.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from ..train.storage import REDACTED, redact
from .plan import Endpoints, Replica, role_of
from .rendezvous import rendezvous_env
from .spec import JobSpec

_VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

# gpupool's own variables in every replica (names defined here only).
JOB_NAME_ENV = "GPUPOOL_JOB_NAME"
JOB_DIR_ENV = "GPUPOOL_JOB_DIR"  # also the marker `processes.sweep` finds strays by
REPLICA_ENV = "GPUPOOL_REPLICA"
ROLE_ENV = "GPUPOOL_ROLE"
REPLICA_INDEX_ENV = "GPUPOOL_REPLICA_INDEX"
RESTART_COUNT_ENV = "GPUPOOL_RESTART_COUNT"
CHECKPOINTS_ENV = "GPUPOOL_CHECKPOINTS"  # the spec's checkpoints: (the trainer's default --out)


# Variables whose names say they hold a secret (AWS_SECRET_ACCESS_KEY, HF_TOKEN, DB_PASSWORD,
# AZURE_STORAGE_CONNECTION_STRING ...): a dry run prints REDACTED for their values.
SECRET_ENV_RE = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|KEY|PRIVATE|CONNECTION_STRING", re.IGNORECASE)


def redacted_env(env: Mapping[str, str]) -> Dict[str, str]:
    """`env` for people to read: the value of a secret-looking name as REDACTED, and in every other
    value a URL's password or signature (`train.storage.redact`)."""
    return {name: REDACTED if value and SECRET_ENV_RE.search(name) else redact(value) for name, value in env.items()}


def redacted_manifest(obj: Any) -> Any:
    """A copy of Kubernetes objects for people to read: each container env entry {name, value} of a
    secret-looking name with its value REDACTED, and every string `redact`ed."""
    if isinstance(obj, dict):
        if set(obj) >= {"name", "value"} and isinstance(obj["value"], str) and SECRET_ENV_RE.search(str(obj["name"])):
            return {**obj, "value": REDACTED if obj["value"] else ""}
        return {key: redacted_manifest(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [redacted_manifest(item) for item in obj]
    return redact(obj) if isinstance(obj, str) else obj


def job_env(name: str, job_dir: str, checkpoints: str = "") -> Dict[str, str]:
    """What every process of a job sees, its setup command included: the job's name and dir, and
    where its checkpoints live when the spec says."""
    env = {JOB_NAME_ENV: name, JOB_DIR_ENV: job_dir}
    if checkpoints:
        env[CHECKPOINTS_ENV] = checkpoints
    return env


def replica_env(
    spec: JobSpec,
    reps: Tuple[Replica, ...],
    endpoints: Endpoints,
    replica: Replica,
    job_dir: str,
    gpu_env: Optional[Mapping[str, str]] = None,
    attempt: int = 0,
) -> Dict[str, str]:
    """The variables gpupool sets for `replica` (on top of the inherited environment).

    Args:
        job_dir: where the job keeps its files (state dir locally, a volume on Kubernetes).
        gpu_env: the isolation env of its GPU share; None for a replica without GPUs,
            which then sees no GPU at all rather than every GPU of the machine.
        attempt: how many times the replica was restarted (0 on the first run).
    """
    # Unbuffered by default so followed logs show lines as they are printed.
    env: Dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    env.update(spec.env)
    env.update(role_of(spec, replica).env)
    env.update(job_env(spec.name, job_dir, spec.checkpoints))
    env.update(
        {
            REPLICA_ENV: replica.name,
            ROLE_ENV: replica.role,
            REPLICA_INDEX_ENV: str(replica.index),
            RESTART_COUNT_ENV: str(attempt),
        }
    )
    env.update(gpu_env if gpu_env is not None else {"CUDA_VISIBLE_DEVICES": ""})
    env.update(rendezvous_env(spec, reps, endpoints, replica))
    return env


def expand(text: str, env: Mapping[str, str]) -> str:
    """Expand `$(VAR)` as Kubernetes does in command and args: unknown names stay
    as written and `$$` is a literal `$`, so one spec means the same on both targets."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR_RE.sub(sub, text)


def expand_command(command: Sequence[str], env: Mapping[str, str]) -> Tuple[str, ...]:
    return tuple(expand(arg, env) for arg in command)
