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
        ({"roles": {"worker": {"command": ["x"], "gpu": {"fraction": 1.5}}}}, "roles.worker.gpu.fraction", "(0, 1]"),
        ({"roles": {"worker": {"command": ["x"], "gpu": {"count": 1}}}}, "roles.worker.gpu", "fraction"),
        (
            {"roles": {"worker": {"command": ["x"], "gpu": {"fraction": 0.5, "memory": "1Gi"}}}},
            "roles.worker.gpu",
            "not both",
        ),
        ({"roles": {"worker": {"command": ["x"], "gpu": {"memory": "lots"}}}}, "roles.worker.gpu.memory", "8Gi"),
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


@pytest.mark.parametrize(
    "changes, message",
    [
        # the field's dotted path, the value as written, the rule and the fix, on one line
        (
            {"roles": {"worker": {"command": ["x"], "gpu": {"count": 0, "fraction": 0.5}}}},
            "roles.worker.gpu.count: 0 must be a whole number >= 1",
        ),
        (
            {"roles": {"worker": {"replicas": "2", "command": ["x"]}}},
            "roles.worker.replicas: '2' must be a whole number",
        ),
        (
            {"roles": {"worker": {"replicas": True, "command": ["x"]}}},
            "roles.worker.replicas: True must be a whole number",
        ),
        ({"backoffSeconds": -1}, "backoffSeconds: -1 must be >= 0"),
        ({"activeDeadlineSeconds": float("nan")}, "activeDeadlineSeconds: nan must be a finite number"),
        ({"priority": 10**12}, "priority: 1000000000000 must be a whole number <= "),
        (
            {"roles": {"worker": {"command": ["x"], "env": {"A": [1]}}}},
            "roles.worker.env.A: [1] must be a string or a number",
        ),
        ({"annotations": {"team": None}}, "annotations.team: None must be a string or a number"),
        (
            {"roles": {"worker": {"command": ["x"], "resources": {"memory": "lots"}}}},
            "roles.worker.resources.memory: memory 'lots' is not a size: write e.g. 8Gi",
        ),
        (
            {"roles": {"worker": {"command": ["x"], "resources": {"gpus": 1}}}},
            "roles.worker.resources.gpus: unknown field: use one of cpu, memory",
        ),
        (
            {"roles": {"worker": {"command": ["x"], "gpu": {"fraction": 0.5, "filters": ["vendor"]}}}},
            "roles.worker.gpu.filters: filter 'vendor' is not KEY=VALUE",
        ),
        (
            {"roles": {"worker": {"command": ["x"], "gpu": {"fraction": 0.5, "count": 10**6}}}},
            "roles.worker.gpu: GPU count 1000000 is over the limit",
        ),
        ({"roles": {"worker": {"command": ["x"], "image": 5}}}, "roles.worker.image: 5 must be a string"),
        ({"roles": "worker"}, "roles: 'worker' must be a mapping of role names"),
    ],
)
def test_errors_carry_the_field_path_the_value_and_the_fix(changes, message):
    with pytest.raises(SpecError) as err:
        parse_spec(spec(**changes))
    assert err.value.message.startswith(message), err.value.message
    assert err.value.path == message.split(":", 1)[0] and "\n" not in err.value.message
    assert err.value.exit_code == 2


def test_the_first_problem_is_named_and_the_others_counted():
    with pytest.raises(SpecError) as err:
        parse_spec(spec(backoffLimit=-1, priority="high", roles={"worker": {"replicas": 0, "command": ["x"]}}))
    assert err.value.message.endswith("(and 2 more)"), err.value.message


def test_a_missing_field_says_what_to_write():
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "j"})
    assert (
        err.value.message
        == "roles: is missing: give at least one role, e.g. roles: {worker: {replicas: 2, command: [...]}}"
    )
    with pytest.raises(SpecError) as err:
        parse_spec({"roles": {"worker": {"command": ["x"]}}})
    assert err.value.message == "name: is missing: give the job a name, e.g. digits-ddp"


def test_empty_sections_in_yaml_mean_none():
    """`env:` with nothing after it is null in YAML: no variables, as before the model."""
    s = parse_spec(
        spec(env=None, annotations=None, setup=None, roles={"worker": {"command": ["x"], "env": None, "gpu": 0}})
    )
    assert s.env == () and s.annotations == () and s.setup == () and s.roles[0].env == () and s.roles[0].gpu is None


def test_the_models_json_schema_takes_what_the_model_takes():
    """The schema the docs show is the YAML form: the examples pass it and the model, a bad one fails both."""
    import pathlib

    import jsonschema
    import yaml

    from gpupool.jobs.spec_model import JobModel

    schema = JobModel.model_json_schema(by_alias=True)
    examples = sorted((pathlib.Path(__file__).parents[2] / "examples").glob("*.yaml"))
    assert len(examples) >= 4
    for path in examples:
        data = yaml.safe_load(path.read_text())
        jsonschema.validate(data, schema)
        assert parse_spec(data).name == data["name"]
    shorthand = spec(roles={"worker": {"command": "python t.py", "gpu": "50%", "resources": {"memory": "8Gi"}}})
    jsonschema.validate(shorthand, schema)
    for bad in (
        spec(name="Digits_DDP"),
        spec(roles={"worker": {"command": ["x"], "restartPolicy": "Never"}}),
        spec(roles={"worker": {"command": ["x"], "gpu": {"fraction": 0.5, "cores": 2}}}),
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
        with pytest.raises(SpecError):
            parse_spec(bad)
