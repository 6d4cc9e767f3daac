"""The pool's fragaware choice: the claim-shape histogram it learns, kept in the store across processes."""

from __future__ import annotations

from gpupool.core.fragmentation import MILLI, TaskShape
from gpupool.core.model import Claim, Holder, Policy
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool
from gpupool.pooling.pool.service import HISTOGRAM_KEY


def test_the_histogram_is_learned_and_kept(tmp_path):
    pool = Pool(tmp_path, devices=emulated_devices("4x16GiB", "n"))
    try:
        for _ in range(3):
            lease = pool.claim(Claim.single(1, fraction=0.25), Holder("a"))
            pool.release(lease.id)
        pool.claim(Claim.single(2, fraction=1.0), Holder("b"))
        assert pool.mix.histogram.observed == 4
    finally:
        pool.close()
    again = Pool(tmp_path)  # another process, or a restart: the first claim saved what the first saw
    try:
        counts = again.mix.histogram.counts()
        assert TaskShape(1, 250) in counts and again.mix.histogram.observed >= 1
        again.claim(Claim.single(1, fraction=0.5), Holder("c"))
        with again.store.read() as tx:
            assert '"milli": 500' in (tx.meta(HISTOGRAM_KEY) or "")
    finally:
        again.close()


def test_a_damaged_histogram_is_learned_again(tmp_path):
    pool = Pool(tmp_path, devices=emulated_devices("2x16GiB", "n"))
    with pool.store.write() as tx:
        tx.set_meta(HISTOGRAM_KEY, '{"shapes": [{"gpus": 1, "milli": 5000}]}')
    pool.close()
    pool = Pool(tmp_path)
    try:
        assert pool.mix.histogram.observed == 0
        assert pool.claim(Claim.single(1, fraction=0.5), Holder("a")).slices
    finally:
        pool.close()


def test_fragaware_keeps_a_whole_gpu_for_whole_gpu_claims(tmp_path):
    pool = Pool(tmp_path, devices=emulated_devices("2x16GiB", "n"))
    try:
        for _ in range(40):  # the pool has seen mostly whole-GPU claims
            pool.release(pool.claim(Claim.single(1, fraction=1.0), Holder("w")).id)
        assert pool.mix.frag.mix.shapes[0][0] == TaskShape(1, MILLI)
        first = pool.claim(Claim.single(1, fraction=0.5), Holder("a"))
        second = pool.claim(Claim.single(1, fraction=0.5, policy=Policy.FRAGAWARE), Holder("b"))
        # both halves on one GPU: the other stays whole
        assert first.slices[0].device_uuid == second.slices[0].device_uuid
        assert pool.claim(Claim.single(1, fraction=1.0), Holder("c")).slices
    finally:
        pool.close()
