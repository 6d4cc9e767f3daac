"""A job spec's `queue:` and `priority:` reach the job's gang claim; bad values name their field."""

from __future__ import annotations

import pytest

from gpupool.jobs.plan import gang_claim
from gpupool.jobs.spec import SpecError, parse_spec, spec_to_dict


def spec(**fields):
    return {
        "name": "ddp",
        "roles": {"worker": {"replicas": 2, "command": ["python", "t.py"], "gpu": {"fraction": 0.5}}},
        **fields,
    }


def test_queue_and_priority_go_into_the_gang_claim_and_back_to_yaml():
    parsed = parse_spec(spec(queue="team-a", priority=5))
    claim = gang_claim(parsed)
    assert claim is not None and claim.queue == "team-a" and claim.priority == 5 and len(claim.requests) == 2
    assert parse_spec(spec_to_dict(parsed)) == parsed
    plain = parse_spec(spec())
    assert (plain.queue, plain.priority) == ("", 0)
    assert "queue" not in spec_to_dict(plain) and "priority" not in spec_to_dict(plain)
    assert gang_claim(plain).queue == ""


@pytest.mark.parametrize(
    "fields, path",
    [
        ({"queue": "Team_A"}, "queue"),
        ({"queue": 5}, "queue"),
        ({"queue": "a" * 64}, "queue"),
        ({"priority": "high"}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": 10**12}, "priority"),
    ],
)
def test_bad_queue_or_priority_names_the_field(fields, path):
    with pytest.raises(SpecError) as err:
        parse_spec(spec(**fields))
    assert err.value.path == path and "\n" not in err.value.message
