"""The source: the ImageFolder tree the cache mirrors.

- ``base.py``: :class:`~cachepipe.source.base.SampleSource`, what the cache needs to read
  files (a home for other sources, e.g. an object store).
- ``reader.py``: stable, bounded reads of local or NFS files in a thread pool.
- ``manifest.py``: :class:`~cachepipe.Manifest`, the scanned samples; ``columns.py``: its
  flat arrays (NOTE [manifest columns]); ``views.py``: the lazy lists over them (NOTE [lazy
  sample lists]); ``fingerprint.py``: its fingerprint; ``manifest_file.py``: the binary
  file it is saved as and mapped from (NOTE [manifest file]); ``reuse.py``: whether a
  saved scan is still current (NOTE [manifest reuse]).
- ``scan.py``: the walk of the class folders, replayed from ``listing.py``'s directory
  listings and stats, made many at a time (NOTE [scan in flight]); ``file_identity.py``:
  what identifies a file's content (NOTE [file identity]).
"""
