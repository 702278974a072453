"""cachepipe: a two-level sample cache for image training on slow storage.

L1 is a local-disk LMDB mirror of the source files; L2 is a sharded Redis store of
decoded, resized samples. This package never imports torch.
"""
