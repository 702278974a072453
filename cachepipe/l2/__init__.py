"""L2: decoded, resized samples in a shared key-value store, by sample index.

- ``spec.py``: :class:`~cachepipe.l2.spec.L2Spec`, the L2 setting resolved once (NOTE [L2
  resolved once]).
- ``store.py``: :class:`~cachepipe.l2.store.SampleStore`, the protocol every backend
  implements; ``registry.py``: backends by URL scheme (NOTE [L2 store registry]).
- Backends: ``shards.py`` (independent Redis servers, rendezvous ``hashing.py``, zero-copy
  ``resp_mget.py``), ``cluster.py`` (Redis Cluster); ``redis_url.py`` names and redacts
  their URLs, ``placement.py`` maps values to nodes.
- ``codec.py``: the value format; ``level.py``: L2 above the raw levels in the cache.

A new backend is one new file here plus one ``register_store`` line in ``registry.py``.
"""
