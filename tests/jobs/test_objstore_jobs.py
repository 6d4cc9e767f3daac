"""A job spec's `checkpoints:` and `storageSecret:` (issue 26): every replica gets the URL as
GPUPOOL_CHECKPOINTS (the trainer's default --out, so a preempted or requeued job resumes from the
bucket on any node), and the Kubernetes and Kubeflow manifests carry the URL and a reference to the
credentials' Secret (envFrom/secretRef), never the credentials."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List

import pytest

from gpupool.jobs.environment import CHECKPOINTS_ENV, replica_env
from gpupool.jobs.manifests import render_indexed, render_kubeflow
from gpupool.jobs.plan import local_endpoints, replicas
from gpupool.jobs.spec import SpecError, parse_spec, spec_to_dict
from gpupool.train.config import CHECKPOINTS_ENV as TRAINER_CHECKPOINTS_ENV

URL = "s3://team-bucket/jobs/digits-ddp"


def _spec(framework: str = "pytorch", **extra: Any) -> Dict[str, Any]:
    return {
        "name": "digits-ddp",
        "framework": framework,
        "image": "registry.example/train:1",
        "checkpoints": URL,
        "storageSecret": "s3-credentials",
        "setup": ["python", "-c", "print('ready')"],
        "roles": {
            ("master" if framework == "pytorch" else "chief"): {"command": ["gpupool", "train", "--data", "s3://d/x"]},
            "worker": {"replicas": 2, "command": ["gpupool", "train", "--data", "s3://d/x"], "gpu": 0.5},
        },
        **extra,
    }


def _containers(objects: List[Dict[str, Any]]) -> Iterator[Dict[str, Any]]:
    """Every container and init container of every pod template in the rendered objects."""

    def walk(node: Any) -> Iterator[Dict[str, Any]]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    yield from value
                else:
                    yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    return walk(objects)


def test_the_trainer_reads_the_name_jobs_set() -> None:
    assert CHECKPOINTS_ENV == TRAINER_CHECKPOINTS_ENV == "GPUPOOL_CHECKPOINTS"


def test_spec_fields_round_trip_and_reach_every_replica() -> None:
    spec = parse_spec(_spec())
    assert (spec.checkpoints, spec.storage_secret) == (URL, "s3-credentials")
    assert parse_spec(spec_to_dict(spec)) == spec
    reps = replicas(spec)
    assert len(reps) == 3
    endpoints = local_endpoints(reps, [29500 + i for i in range(len(reps))])
    for rep in reps:
        env = replica_env(spec, reps, endpoints, rep, "/tmp/job")
        assert env[CHECKPOINTS_ENV] == URL
    without = parse_spec({k: v for k, v in _spec().items() if k not in ("checkpoints", "storageSecret")})
    assert CHECKPOINTS_ENV not in replica_env(without, replicas(without), endpoints, replicas(without)[0], "/j")


@pytest.mark.parametrize("render", [render_indexed, render_kubeflow], ids=["kubernetes", "kubeflow"])
def test_manifests_carry_the_url_and_the_secret_reference(render: Any) -> None:
    objects = render(parse_spec(_spec()))
    containers = list(_containers(objects))
    assert containers, objects
    for container in containers:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[CHECKPOINTS_ENV] == URL, container["name"]
        assert container["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}], container["name"]
    text = repr(objects)
    assert "AWS_SECRET_ACCESS_KEY" not in text  # a reference, never the values


def test_manifests_with_a_secret_pass_the_clients_models() -> None:
    pytest.importorskip("kubernetes")
    from .test_manifests import check_model

    for obj in render_indexed(parse_spec(_spec())):
        if obj["kind"] == "Job":
            check_model(obj["spec"]["template"]["spec"], "V1PodSpec")


def test_a_tensorflow_job_too() -> None:
    for container in _containers(render_kubeflow(parse_spec(_spec("tensorflow")))):
        assert container["envFrom"][0]["secretRef"]["name"] == "s3-credentials"


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("checkpoints", "ftp2://x/y", "unknown scheme 'ftp2'"),
        ("checkpoints", "s3://AKIA:secret@bucket/x", "carries credentials"),
        ("checkpoints", 3, "must be a URL"),
        ("storageSecret", "Bad_Name", "not a Kubernetes Secret name"),
    ],
)
def test_bad_values_are_one_line_errors(field: str, value: Any, words: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(**{field: value}))
    assert err.value.message.startswith(f"{field}: ") and words in err.value.message
    assert "\n" not in err.value.message and err.value.exit_code == 2


def test_a_local_path_is_fine() -> None:
    assert parse_spec(_spec(checkpoints="/shared/ckpt")).checkpoints == "/shared/ckpt"
