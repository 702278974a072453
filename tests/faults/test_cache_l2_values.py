"""Issue 17, item 9: checksummed L2 values of impossible shapes are misses, never samples;
the L2 namespace names the decoder."""
from __future__ import annotations

import warnings

import numpy as np

from cachepipe import TwoLevelCache
from cachepipe.decode import DECODER_TAG, possible_shape
from cachepipe.l2.codec import encode_sample


def test_impossible_shapes_are_misses_and_are_rewritten(source, tmp_path, redis_server):
    with TwoLevelCache(source, tmp_path / "c", [redis_server.url], 32, use_l1=False) as cache:
        good = cache.get_many(range(len(cache)))
        assert cache.namespace.endswith(f":32:{DECODER_TAG}:")
        client = redis_server.client()
        forged = {0: np.zeros((0, 0, 3), np.uint8), 1: np.full((7, 9, 3), 200, np.uint8),
                  2: np.zeros((32, 300, 3), np.uint8)}  # longer than 8x: the policy caps it
        for i, arr in forged.items():
            client.set(f"{cache.namespace}{i}", encode_sample(i, arr))  # valid header and checksum
        # the pre-tag key layout of an older version holds garbage: never read
        client.set(f"cachepipe:{cache.fingerprint}:32:3", encode_sample(3, forged[1]))
    with TwoLevelCache(source, tmp_path / "c", [redis_server.url], 32, use_l1=False) as cache:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = cache.get_many(range(len(cache)))
        assert all(np.array_equal(a, b) for a, b in zip(got, good))
        s = cache.stats()
        assert s["l2_corrupt"] == 3 and s["l2_hits"] == len(cache) - 3
        assert any("impossible at cache size 32" in str(w.message) for w in caught)
        cache.get_many([0, 1, 2])  # rewritten with the right values
        assert cache.stats()["l2_corrupt"] == 3


def test_possible_shapes_follow_the_resize_policy():
    assert possible_shape((256, 2048, 3), 256) and possible_shape((100, 2048, 3), 256)
    assert possible_shape((2048, 256, 3), 256) and possible_shape((256, 256, 3), 256)
    for bad in [(0, 0, 3), (255, 300, 3), (256, 2049, 3), (100, 2000, 3), (256, 300, 4), (256, 300)]:
        assert not possible_shape(bad, 256), bad
