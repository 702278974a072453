"""Which node holds each sample (NOTE [placement]), checked against what the real servers hold:
plain shards with replicas and a dead shard, and a real Redis Cluster's slot owners."""
from __future__ import annotations

import numpy as np
import pytest

from cachepipe import TwoLevelCache
from cachepipe.l2.placement import LocalityError, node_of_hosts
from cachepipe.warmup import warmup


def _warm_cache(source, cache_dir, urls, **kw):
    cache = TwoLevelCache(source, cache_dir, redis=urls, cache_size=24, **kw)
    warmup(cache, progress=False)
    return cache


def test_replicas_move_a_dead_primarys_samples_to_the_replicas_node(source, cache_dir, redis_servers):
    servers = redis_servers(3)
    cache = _warm_cache(source, cache_dir, [s.url for s in servers], replicas=2)
    owners = cache.store.owners(np.arange(len(cache)))
    assert cache.store.node_of(range(len(cache))).tolist() == owners[:, 0].tolist()
    servers[0].kill()
    placed = cache.store.node_of(range(len(cache)))
    assert placed.tolist() == [o[1] if o[0] == 0 else o[0] for o in owners.tolist()]
    clients = [s.client() for s in servers]
    assert all(clients[k].exists(f"{cache.namespace}{i}") for i, k in enumerate(placed.tolist()))


def test_cluster_placement_names_the_node_whose_primary_holds_the_key(source, cache_dir, redis_cluster):
    url, clients, procs = redis_cluster
    ports = [c.connection_pool.connection_kwargs["port"] for c in clients]
    seeds = [f"redis-cluster://127.0.0.1:{p}" for p in ports[::-1]]  # node order: reversed ports
    cache = _warm_cache(source, cache_dir, seeds)
    placed = cache.store.node_of(range(len(cache)))
    node_clients = clients[::-1]
    assert all(node_clients[k].exists(f"{cache.namespace}{i}") for i, k in enumerate(placed.tolist()))
    assert set(placed.tolist()) == {0, 1, 2}
    # a primary no URL names belongs to the node on its host (here the first: all share 127.0.0.1)
    short = TwoLevelCache(source, cache_dir, redis=seeds[:2], cache_size=24)
    assert short.store.node_of(range(len(cache))).tolist() == [0 if k == 2 else k for k in placed.tolist()]
    short.close()
    procs[0].kill()  # node 2's primary (reversed order): its slots have no live holder now
    procs[0].wait()
    after = cache.store.node_of(range(len(cache)))
    assert after.tolist() == [-1 if k == 2 else k for k in placed.tolist()]


def test_a_primary_on_no_listed_node_is_refused_naming_it():
    assert node_of_hosts([("127.0.0.1", 7001), ("localhost", 7000)], [("127.0.0.1", 7000)]).tolist() == [0, 0]
    with pytest.raises(LocalityError, match="primary 127.0.0.2:7000 is on none of the nodes.*one URL per node"):
        node_of_hosts([("127.0.0.2", 7000)], [("127.0.0.1", 7000), ("127.0.0.1", 7001)])
