"""core.outage: the clients' retry schedule through a server outage, and the claim key's rule."""

from __future__ import annotations

import itertools

import pytest

from gpupool.core.outage import JITTER, RETRY_FIRST_S, RETRY_MAX_S, TICKET_REATTACH_S, backoff, check_key, new_key


def test_backoff_doubles_from_the_first_step_to_its_cap_with_jitter():
    pauses = list(itertools.islice(backoff(3.0), 40))
    steps = [min(RETRY_FIRST_S * 2**i, 3.0) for i in range(40)]
    assert all((1 - JITTER) * step <= pause <= step for pause, step in zip(pauses, steps))
    assert max(pauses) <= 3.0 and len(set(pauses[10:])) > 1, "capped, and jittered at the cap"


def test_a_cap_below_the_first_step_is_the_step():
    assert max(itertools.islice(backoff(0.05), 10)) <= 0.05


def test_a_kept_ticket_outlasts_a_claim_retry():
    # A restarted server keeps a waiting claim's ticket long enough for a client still there to come back.
    assert TICKET_REATTACH_S > 5 * RETRY_MAX_S


def test_claim_keys():
    assert check_key(new_key()) and new_key() != new_key()
    for bad in ["a" * 15, "a" * 65, "a" * 20 + "\n", "a" * 20 + " ", "ä" * 20, 7, None]:
        with pytest.raises(ValueError, match="key"):
            check_key(bad)
