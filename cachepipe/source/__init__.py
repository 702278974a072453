"""The source: the ImageFolder tree the cache mirrors.

- ``base.py``: :class:`~cachepipe.source.base.SampleSource`, what the cache needs to read
  files (a home for other sources, e.g. an object store).
- ``reader.py``: stable, bounded reads of local or NFS files in a thread pool.
- ``manifest.py``, ``scan.py``: the scanned list of samples and its fingerprint;
  ``file_identity.py``: what identifies a file's content (NOTE [file identity]).
"""
