"""L2: decoded, resized samples in a key-value store, by sample index.

- ``spec.py``: :class:`~cachepipe.l2.spec.L2Spec`, the L2 setting resolved once (NOTE [L2
  resolved once]).
- ``store.py``: :class:`~cachepipe.l2.store.SampleStore`, the protocol every backend
  implements and the capabilities it may declare (NOTE [L2 store protocol]);
  ``registry.py``: backends by URL scheme, each with its URL rule (NOTE [L2 store registry]).
- Backends: ``shards.py`` (independent Redis servers, rendezvous ``hashing.py``, zero-copy
  ``resp_mget.py``), ``cluster.py`` (Redis Cluster), ``shm.py`` (this node's memory: LMDB
  on a tmpfs, ``shm_dir.py`` its directory, ``shm_env.py`` its environments and pinned
  views); ``redis_url.py`` names and redacts Redis URLs, ``placement.py`` maps values to nodes.
- ``codec.py``: the value format; ``level.py``: L2 above the raw levels in the cache.

A new backend is one new file here plus one ``register_store`` line in ``registry.py``
(docs/cache.md, "Adding an L2 backend").
"""
