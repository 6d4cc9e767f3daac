"""Who ended a lease (issue 34, item 2): the pool records it in the history when the lease is released
or its token revoked, and tells whoever asks for the lease afterwards (the runner's watch and
heartbeat) how it ended and who ended it."""

from __future__ import annotations

import pytest
from clock import FakeClock

from gpupool.core.errors import Forbidden, NotFound
from gpupool.core.model import Claim, Holder
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool
from gpupool.pooling.store import tx_history as store_tx  # how_ended reads ENDED_LOOKBACK there
from gpupool.serving.server.auth import create_token, revoke_token


@pytest.fixture
def pool(tmp_path):
    p = Pool(tmp_path, devices=emulated_devices("emulated:2x16GiB", "n"), node="n", clock=FakeClock(1000.0))
    yield p
    p.close()


def claim(pool: Pool, name: str = "alice") -> str:
    return pool.claim(Claim.single(1, fraction=0.25), Holder(name, 1, "h")).id


def ended_message(pool: Pool, lease_id: str) -> str:
    """What the runner's watch and heartbeat are told once the lease is gone."""
    with pytest.raises(NotFound) as watched:
        pool.watch(lease_id, 1.0)
    with pytest.raises(NotFound) as renewed:
        pool.heartbeat(lease_id)
    assert watched.value.message == renewed.value.message
    return watched.value.message


def ended_by(pool: Pool) -> dict:
    # Until far ahead: a revocation ends leases at the wall clock's time, not the fake one's.
    return {r.lease_id: (r.reason, r.ended_by) for r in pool.history(0.0, 4e9)}


def test_the_owner_and_an_admin_are_told_apart(pool):
    own, other, named, anonymous = claim(pool), claim(pool), claim(pool), claim(pool)
    pool.release(own, "alice")  # the holder's token
    pool.release(other, None, None, "ops")  # an admin token called ops
    pool.release(named, None, None, "alice")  # an admin acting under the holder's own name: its owner
    pool.release(anonymous)  # an admin nobody named
    assert ended_by(pool) == {
        own: ("released", "owner"),
        other: ("released", "admin"),
        named: ("released", "owner"),
        anonymous: ("released", "admin"),
    }
    assert ended_message(pool, own) == f"lease {own!r} was released by its owner ('alice')"
    assert ended_message(pool, other) == f"lease {other!r} was released by an admin"


def test_a_refused_release_records_nothing(pool):
    lease = claim(pool)
    with pytest.raises(Forbidden):
        pool.release(lease, "mallory")
    assert ended_by(pool) == {}
    pool.heartbeat(lease)  # still live


def test_a_revoked_token_ends_the_leases_it_holds_and_no_others(pool):
    create_token(pool.store, "bob")
    bobs, alices = [claim(pool, "bob"), claim(pool, "bob")], claim(pool, "alice")
    revoke_token(pool.store, "bob")
    assert ended_by(pool) == dict.fromkeys(bobs, ("revoked", "admin"))
    assert ended_message(pool, bobs[0]) == f"lease {bobs[0]!r} ended: its token 'bob' was revoked by an admin"
    assert [lease.id for lease in pool.status().leases] == [alices]
    # Their memory went back, also in the pool's own view of it: the rest of both GPUs fits.
    assert sum(pool.status().allocated().values()) == 4096
    pool.claim(Claim.single(2, fraction=0.75), Holder("carol"))


def test_an_expiry_and_an_unknown_lease_say_so(pool):
    lease = claim(pool)
    pool.clock.now += 31.0  # past the TTL: the next write reclaims it
    pool.expire()
    assert ended_message(pool, lease) == f"lease {lease!r} expired: no heartbeat came within its TTL"
    assert "does not exist" in ended_message(pool, "no-such-lease")


def test_only_the_newest_history_is_read_for_a_gone_lease(pool, monkeypatch):
    old, newer = claim(pool), claim(pool)
    pool.release(old, "alice")
    pool.release(newer, "alice")
    monkeypatch.setattr(store_tx, "ENDED_LOOKBACK", 1)
    assert "released by its owner" in ended_message(pool, newer)
    assert "does not exist" in ended_message(pool, old)  # out of the window: the general message
