"""The embedded L2: ``redis-server`` processes private to one cache dir.

- ``embedded.py``: one server (start, reuse, stop, maxmemory); ``embedded_group.py``: a
  node's several servers (NOTE [a node's L2]).
- ``idle_watch.py``: each server's watcher, which stops it when nobody used it for an idle
  time or its directory was deleted (NOTE [idle embedded server]).
- ``identity.py``: proof that a running server is this cache's before it is signalled.
- ``socket_path.py``: its private Unix socket; ``redis_binary.py``: which ``redis-server``.
"""
