"""Rendezvous sharding: spread, stability when a shard is added, replicas on real servers."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from cachepipe.l2.hashing import rendezvous_owners, shard_seed
from cachepipe.l2.shards import ShardedRedisStore

N = 20_000


def _seeds(k):
    return [shard_seed(f"redis://node{i}:6379/0") for i in range(k)]


def test_spread_is_even():
    owners = rendezvous_owners(np.arange(N), _seeds(5))[:, 0]
    counts = np.bincount(owners, minlength=5)
    assert counts.min() > 0.9 * N / 5 and counts.max() < 1.1 * N / 5


def test_adding_a_shard_moves_about_one_over_n():
    before = rendezvous_owners(np.arange(N), _seeds(4))[:, 0]
    after = rendezvous_owners(np.arange(N), _seeds(5))[:, 0]
    moved = before != after
    assert 0.15 < moved.mean() < 0.25  # ~1/5
    assert np.all(after[moved] == 4)  # only to the new shard, never between old ones
    again = rendezvous_owners(np.arange(N), _seeds(4))[:, 0]
    assert np.array_equal(before, again)  # stable across calls (and processes: pure function)


def test_replicas_are_distinct_and_primary_is_unchanged():
    one = rendezvous_owners(np.arange(N), _seeds(4), 1)
    three = rendezvous_owners(np.arange(N), _seeds(4), 3)
    assert np.array_equal(one[:, 0], three[:, 0])
    assert all(len(set(row)) == 3 for row in three[:200].tolist())
    with pytest.raises(ValueError, match="replicas must be in 1..4"):
        rendezvous_owners([1], _seeds(4), 5)


def test_store_places_values_on_their_owners(redis_servers):
    servers = redis_servers(3)
    counters = Counter()
    store = ShardedRedisStore([s.url for s in servers], namespace="t:fp:8:", counters=counters, replicas=2)
    items = [(i, f"v{i}".encode()) for i in range(300)]
    assert store.put_many(items) == 300
    owners = store.owners(range(300))
    for s, server in enumerate(servers):
        keys = {int(k.rsplit(b":", 1)[1]) for k in server.client().keys("t:fp:8:*")}
        assert keys == {i for i in range(300) if s in owners[i]}
        assert 0.5 * 200 < len(keys) < 1.5 * 200  # 2 of 3 shards hold each value
    assert store.get_many(list(range(300))) == [v for _, v in items]
    assert store.missing(list(range(305))) == [300, 301, 302, 303, 304]
    servers[0].client().delete(f"t:fp:8:{int(np.nonzero((owners == 0).any(axis=1))[0][0])}")
    assert len(store.missing(list(range(300)))) == 1  # a lost replica counts as missing
    assert counters["l2_errors"] == 0
    with pytest.raises(ValueError, match="duplicate"):
        ShardedRedisStore([servers[0].url] * 2, namespace="x:", counters=Counter())
