"""Rendered job manifests against the API schemas of every Kubernetes release people run
(kubernetes-validate, strict: unknown fields are errors), and Kubeflow kinds against the
training operator's CRDs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpupool.cli.main import main
from gpupool.core.errors import InvalidInput
from gpupool.jobs.manifests import render_indexed, render_kubeflow
from gpupool.jobs.manifests.versions import parse_kube_version
from gpupool.jobs.spec import load_spec, parse_spec

kv = pytest.importorskip("kubernetes_validate")

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
VERSIONS = [f"1.{minor}" for minor in range(28, 38)]
EXTRA = {
    "name": "tf-full",
    "framework": "tensorflow",
    "image": "tensorflow/tensorflow:2.16.1",
    "restartPolicy": "ExitCode",
    "activeDeadlineSeconds": 600,
    "setup": ["sh", "-c", "echo ready"],
    "workingDir": "/work",
    "annotations": {"team": "vision"},
    "roles": {
        "chief": {"command": ["python", "t.py"], "gpu": {"count": 1, "memory": "8G"}},
        "worker": {
            "replicas": 2,
            "command": ["python", "t.py"],
            "gpu": {"fraction": 0.25, "filters": ["device.name=*A100*"]},
        },
        "ps": {"command": ["python", "t.py"]},
        "evaluator": {"command": ["python", "eval.py"]},
    },
}


def specs():
    return [load_spec(str(p)) for p in EXAMPLES] + [parse_spec(EXTRA)]


def schema_for(version: str) -> str:
    try:
        kv.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe"}}, version, strict=True)
    except kv.ValidationError:
        pass
    except Exception as err:  # the wheel has no schema for this release
        pytest.skip(f"kubernetes-validate has no schema for {version}: {err}")
    return version


def validate(obj, version):
    try:
        kv.validate(obj, version, strict=True)
    except kv.ValidationError as err:
        raise AssertionError(
            f"{obj['kind']} {obj['metadata']['name']} for {version}: {str(err).splitlines()[0]}"
        ) from None


@pytest.mark.parametrize("version", VERSIONS)
def test_indexed_jobs_validate_for_each_release(version):
    schema_for(version)
    parsed = parse_kube_version(version)
    seen_policy = False
    for spec in specs():
        for obj in render_indexed(spec, parsed):
            validate(obj, version)
            if obj["kind"] == "Job":
                has_policy = "successPolicy" in obj["spec"]
                assert has_policy <= (parsed >= (1, 31)), f"{obj['metadata']['name']} for {version}"
                seen_policy |= has_policy
    assert seen_policy == (parsed >= (1, 31))  # digits-ddp: worker 0 is the chief


@pytest.mark.parametrize("version", ["1.29", "1.31"])
def test_done_when_dry_run_for_a_release_passes_its_schema(version, capsys):
    """`gpupool submit examples/digits-ddp.yaml --target kubernetes --dry-run --kube-version V`."""
    schema_for(version)
    example = next(p for p in EXAMPLES if p.name == "digits-ddp.yaml")
    assert main(["submit", str(example), "--target", "kubernetes", "--dry-run", "--kube-version", version]) == 0
    objects = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    for obj in objects:
        validate(obj, version)
    (job,) = [o for o in objects if o["kind"] == "Job"]
    assert ("successPolicy" in job["spec"]) == (version == "1.31")


def test_kube_version_forms_and_refusals():
    assert parse_kube_version("v1.30.2-gke.1587003") == (1, 30)
    assert parse_kube_version("1.37") == (1, 37)
    for bad in ("1.27", "latest", "1"):
        with pytest.raises(InvalidInput, match="--kube-version"):
            parse_kube_version(bad)


def test_kubeflow_kinds_pass_the_training_operator_crds():
    from .crds import validate_custom

    rendered = [o for s in specs() if s.framework.value in ("tensorflow", "pytorch") for o in render_kubeflow(s)]
    assert {o["kind"] for o in rendered} == {"TFJob", "PyTorchJob"}
    for obj in rendered:
        validate_custom(obj)  # skips, saying why, when the CRDs are not at hand
