"""slowfs: a source tree served read-only through FUSE as a networked file share would
serve it (NOTE [slowfs profile]), so that what each cache level buys over NFS is measurable
on one machine.

- ``profile.py``: :class:`~cachepipe.slowfs.profile.SlowProfile`, the latency and bandwidth
  of the emulated share, with its defaults from a published cloud file-share profile;
- ``throttle.py``: the shared bandwidth cap (a token bucket) and the per-file counters;
- ``fs.py``: the FUSE operations (``mfusepy``, imported only when a file system is served);
- ``mount.py``: the checks before a mount (``/dev/fuse``, ``fusermount3``, the mountpoint,
  a dead mount left by a killed slowfs) and :func:`~cachepipe.slowfs.mount.serve`.

The command line is ``cachepipe slowfs`` (``tools/slowfs.py``); benchmarks mount one over
their source with ``tools/bench/harness/slow_source.py``.
"""
from cachepipe.slowfs.profile import SlowProfile

__all__ = ["SlowProfile"]
