"""Spec validation: good specs parse, bad fields are named with a fix."""

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.jobs.spec import Framework, RestartPolicy, SpecError, SuccessPolicy, load_spec, parse_spec, spec_to_dict

GOOD = {
    "name": "digits-ddp",
    "framework": "pytorch",
    "restartPolicy": "OnFailure",
    "backoffLimit": 2,
    "roles": {"worker": {"replicas": 2, "command": "python train.py --epochs 3", "gpu": {"count": 1, "fraction": 0.5}}},
}


def spec(**changes):
    data = dict(GOOD.items())
    data.update(changes)
    return data


def test_good_spec_parses():
    s = parse_spec(GOOD)
    assert s.framework is Framework.PYTORCH
    assert s.restart_policy is RestartPolicy.ON_FAILURE
    assert s.success_policy is SuccessPolicy.CHIEF
    (worker,) = s.roles
    assert worker.command == ("python", "train.py", "--epochs", "3")
    assert worker.gpu.fraction == 0.5 and worker.gpu.count == 1


def test_roles_kept_in_framework_rank_order():
    s = parse_spec(
        {
            "name": "t",
            "framework": "tensorflow",
            "roles": {
                "evaluator": {"command": ["e"]},
                "ps": {"command": ["p"]},
                "worker": {"replicas": 2, "command": ["w"]},
                "chief": {"command": ["c"]},
            },
        }
    )
    assert [r.name for r in s.roles] == ["chief", "worker", "ps", "evaluator"]


def test_roundtrip():
    s = parse_spec(
        spec(
            env={"A": 1},
            activeDeadlineSeconds=60,
            roles={"worker": {"replicas": 2, "command": ["x"], "gpu": {"count": 2, "memory": "8Gi"}}},
        )
    )
    assert parse_spec(spec_to_dict(s)) == s


def test_memory_and_percent_forms():
    s = parse_spec(spec(roles={"worker": {"command": ["x"], "gpu": {"amount": 2, "memory": "8Gi"}}}))
    assert s.roles[0].gpu.memory_mib == 8192 and s.roles[0].gpu.count == 2
    s = parse_spec(spec(roles={"worker": {"command": ["x"], "gpu": "50%"}}))
    assert s.roles[0].gpu.fraction == 0.5


@pytest.mark.parametrize(
    "changes, path, hint",
    [
        ({"name": "Digits_DDP"}, "name", "lowercase"),
        ({"framework": "jax"}, "framework", "pytorch"),
        ({"restartPolicy": "Always"}, "restartPolicy", "OnFailure"),
        ({"backoffLimit": -1}, "backoffLimit", ">= 0"),
        ({"successPolicy": "any"}, "successPolicy", "allWorkers"),
        ({"activeDeadlineSeconds": "soon"}, "activeDeadlineSeconds", "number"),
        ({"replicas": 2}, "replicas", "unknown field"),
        ({"roles": {}}, "roles", "at least one role"),
        ({"roles": {"chief": {"command": ["x"]}}}, "roles.chief", "master, worker"),
        ({"roles": {"worker": {"replicas": 0, "command": ["x"]}}}, "roles.worker.replicas", ">= 1"),
        ({"roles": {"worker": {"replicas": 1}}}, "roles.worker.command", "missing"),
        ({"roles": {"worker": {"command": []}}}, "roles.worker.command", "empty"),
        ({"roles": {"worker": {"command": ["x"], "gpu": {"fraction": 1.5}}}}, "roles.worker.gpu", "(0, 1]"),
        ({"roles": {"worker": {"command": ["x"], "gpu": {"count": 1}}}}, "roles.worker.gpu", "fraction"),
        (
            {"roles": {"worker": {"command": ["x"], "gpu": {"fraction": 0.5, "memory": "1Gi"}}}},
            "roles.worker.gpu",
            "not both",
        ),
        ({"roles": {"worker": {"command": ["x"], "gpu": {"memory": "lots"}}}}, "roles.worker.gpu", "8Gi"),
        (
            {"roles": {"worker": {"command": ["x"], "gpu": {"fraction": 0.5, "cores": 2}}}},
            "roles.worker.gpu.cores",
            "unknown",
        ),
        ({"roles": {"worker": {"command": ["x"], "env": {"1BAD": "x"}}}}, "roles.worker.env.1BAD", "variable name"),
        ({"roles": {"master": {"replicas": 2, "command": ["x"]}}}, "roles.master.replicas", "exactly one"),
        (
            {"roles": {"worker": {"command": ["x"], "restartPolicy": "Never"}}},
            "roles.worker.restartPolicy",
            "top level",
        ),
    ],
)
def test_bad_fields_are_named(changes, path, hint):
    with pytest.raises(SpecError) as err:
        parse_spec(spec(**changes))
    assert err.value.message.startswith(path + ":"), err.value.message
    assert hint in err.value.message
    assert err.value.exit_code == 2


def test_tensorflow_rules():
    with pytest.raises(SpecError, match="roles: needs a chief"):
        parse_spec({"name": "t", "framework": "tensorflow", "roles": {"ps": {"command": ["p"]}}})
    with pytest.raises(SpecError, match="roles.evaluator.replicas"):
        parse_spec(
            {
                "name": "t",
                "framework": "tensorflow",
                "roles": {"worker": {"command": ["w"]}, "evaluator": {"replicas": 2, "command": ["e"]}},
            }
        )


def test_load_spec_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(InvalidInput, match="not valid YAML at line"):
        load_spec(str(bad))
    with pytest.raises(InvalidInput, match="cannot read job spec"):
        load_spec(str(tmp_path / "missing.yaml"))


def test_cli_bad_spec_exits_2_without_traceback(tmp_path, capsys):
    from gpupool.cli.main import main

    path = tmp_path / "job.yaml"
    path.write_text("name: x\nroles: {worker: {command: [x], gpu: {fraction: 2}}}\n")
    assert main(["submit", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "roles.worker.gpu" in err and "Traceback" not in err
