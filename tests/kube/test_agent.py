"""Node agent parts: releasing leases of gone pods, syncing user tokens, against a real pool."""

from __future__ import annotations

import os
import time

from waiting import wait_until

from gpupool.core.model import Claim, Holder
from gpupool.kube.agent import release_orphans, sync_tokens
from gpupool.kube.extender import NodeState
from gpupool.pooling.devices import discover
from gpupool.pooling.pool import Pool


def test_releases_only_leases_of_pods_that_are_gone(tmp_path):
    pool = Pool(tmp_path / "state", devices=discover("emulated:2x16GiB", "node-a"), node="node-a")
    try:
        gone = pool.claim(Claim.single(1, fraction=0.5), Holder("team-a", 1, "h", "pod:team-a/old:uid-gone"))
        live = pool.claim(Claim.single(1, fraction=0.5), Holder("team-a", 2, "h", "pod:team-a/new:uid-live"))
        local = pool.claim(Claim.single(1, fraction=0.5), Holder("me", 3, "h", "my notebook"))
        listed_at = time.time() + 1
        young = pool.claim(Claim.single(1, fraction=0.25), Holder("team-a", 4, "h", "pod:team-a/young:uid-young"))
        released = release_orphans(pool, {"uid-live"}, listed_at=young.created_at)
        assert [lease.id for lease in released] == [gone.id]
        left = {lease.id for lease in pool.status().leases}
        assert left == {live.id, local.id, young.id}  # the young pod may be missing from an older list
        assert [x.id for x in release_orphans(pool, {"uid-live"}, listed_at)] == [young.id]
        # The extender sees pod UIDs with leases in the agent's status.
        state = NodeState.from_status(pool.status().to_dict())
        assert state.holders == {"uid-live"}
    finally:
        pool.close()


def test_user_tokens_from_the_secret_volume(tmp_path):
    from gpupool.serving.server.auth import Authenticator

    pool = Pool(tmp_path / "state", devices=discover("emulated:1x16GiB", "n"), node="n")
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "team-a").write_text("a-token-of-at-least-16-chars\n")
    (tokens / "short").write_text("x")
    (tokens / "..data").mkdir()  # Secret volumes keep their data behind ..data links
    try:
        assert sync_tokens(pool.store, str(tokens)) == 1
        assert sync_tokens(pool.store, str(tokens)) == 0  # unchanged: no write
        who = Authenticator("admin-token-of-16-chars-or-more", pool.store).identify(
            "Bearer a-token-of-at-least-16-chars"
        )
        assert who.name == "team-a" and not who.admin
    finally:
        pool.close()


def test_live_pods_file_is_unknown_until_it_exists(tmp_path):
    from gpupool.kube.agent import file_live_pods, reap_once

    path = tmp_path / "live-pods"
    live = file_live_pods(str(path))
    assert live() is None
    pool = Pool(tmp_path / "state", devices=discover("emulated:1x16GiB", "n"), node="n")
    try:
        lease = pool.claim(Claim.single(1, fraction=0.5), Holder("team-a", 1, "h", "pod:team-a/old:uid-gone"))
        assert reap_once(pool, live) == []  # no list yet: nothing is released

        def listed_after_the_claim() -> bool:
            """The list written (again) until its mtime, coarser than the clock, is past the lease's creation."""
            path.write_text("# pods on n\nuid-live  \n\n")
            return os.stat(path).st_mtime > lease.created_at

        wait_until(listed_after_the_claim, 10, "a pod list written after the lease's claim")
        assert live()[0] == {"uid-live"}
        assert [x.id for x in reap_once(pool, live)] == [lease.id]
    finally:
        pool.close()
