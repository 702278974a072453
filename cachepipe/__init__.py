"""cachepipe: a two-level sample cache for image training on slow storage.

L1 is a local-disk LMDB mirror of the source files; L2 is a sharded Redis store of
decoded, resized samples. This package never imports torch.

Example:
    >>> from cachepipe import TwoLevelCache
    >>> with TwoLevelCache("demo/train", "demo/cache") as cache:  # doctest: +SKIP
    ...     image = cache.get(0)
"""
from cachepipe.config import CacheConfig
from cachepipe.decode import decode_and_resize
from cachepipe.errors import CacheWarning, CorruptSampleError, EmptyFolderError, L1FullError, L2UnavailableError
from cachepipe.server.embedded import EmbeddedRedis
from cachepipe.source.manifest import IMG_EXTENSIONS, Manifest
from cachepipe.two_level import TwoLevelCache

__all__ = [
    "CacheConfig",
    "CacheWarning",
    "CorruptSampleError",
    "EmbeddedRedis",
    "EmptyFolderError",
    "IMG_EXTENSIONS",
    "L1FullError",
    "L2UnavailableError",
    "Manifest",
    "TwoLevelCache",
    "decode_and_resize",
]
