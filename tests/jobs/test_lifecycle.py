"""Restart and success rules, without processes."""

from gpupool.jobs.lifecycle import Action, backoff_delay, decide
from gpupool.jobs.plan import replicas
from gpupool.jobs.spec import parse_spec
from gpupool.workload.runner.child import exit_code


def job(framework="pytorch", policy="OnFailure", limit=2, success="chief", roles=None):
    roles = roles or {"worker": {"replicas": 2, "command": ["x"]}}
    return parse_spec(
        {
            "name": "j",
            "framework": framework,
            "restartPolicy": policy,
            "backoffLimit": limit,
            "successPolicy": success,
            "roles": roles,
        }
    )


def test_replica_exit_codes_follow_the_shell():
    # the supervisor records replicas' exits with the runner's mapping: signal N is 128+N
    assert exit_code(-9) == 137 and exit_code(3) == 3


def test_pytorch_failure_restarts_whole_group():
    spec = job()
    reps = replicas(spec)
    d = decide(spec, reps, {"worker-0": None, "worker-1": 1}, 0)
    assert d.action is Action.RESTART and d.replicas == reps


def test_backoff_limit_and_never():
    spec = job(limit=1)
    reps = replicas(spec)
    assert decide(spec, reps, {"worker-1": 1}, 1).action is Action.FAIL
    never = job(policy="Never")
    assert decide(never, replicas(never), {"worker-1": 1}, 0).action is Action.FAIL


def test_exit_code_policy():
    spec = job(policy="ExitCode")
    reps = replicas(spec)
    assert decide(spec, reps, {"worker-1": 137}, 0).action is Action.RESTART
    d = decide(spec, reps, {"worker-1": 2}, 0)
    assert d.action is Action.FAIL and "1-127" in d.message


def test_ps_strategy_restarts_one_replica():
    spec = job(
        "tensorflow",
        roles={"chief": {"command": ["c"]}, "worker": {"replicas": 2, "command": ["w"]}, "ps": {"command": ["p"]}},
    )
    reps = replicas(spec)
    d = decide(spec, reps, {"worker-1": 137}, 0)
    assert d.action is Action.RESTART and [r.name for r in d.replicas] == ["worker-1"]


def test_success_policies():
    spec = job()
    reps = replicas(spec)
    assert decide(spec, reps, {"worker-0": 0, "worker-1": None}, 0).action is Action.SUCCEED
    assert decide(spec, reps, {"worker-0": None, "worker-1": 0}, 0).action is Action.CONTINUE
    allw = job(success="allWorkers")
    assert decide(allw, replicas(allw), {"worker-0": 0, "worker-1": None}, 0).action is Action.CONTINUE
    assert decide(allw, replicas(allw), {"worker-0": 0, "worker-1": 0}, 0).action is Action.SUCCEED
    ps = job(
        "tensorflow",
        roles={"worker": {"replicas": 2, "command": ["w"]}, "ps": {"command": ["p"]}},
        success="allWorkers",
    )
    # ps never ends: all workers done is success
    assert decide(ps, replicas(ps), {"worker-0": 0, "worker-1": 0, "ps-0": None}, 0).action is Action.SUCCEED


def test_backoff_grows():
    spec = job()
    assert backoff_delay(spec, 0) == 1.0 and backoff_delay(spec, 2) == 4.0 and backoff_delay(spec, 20) == 300.0
