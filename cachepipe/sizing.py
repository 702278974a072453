"""The data side of a cluster on paper: L2 memory and L1 disk per node, the warm-up's
time and the Redis servers a node's feed needs (for ``cachepipe plan``).

Each figure follows the rule the cache itself applies: a sample's bytes in L2 are its
decoded pixels at the cached size (the resize policy, ``cachepipe.decode.resized_shape``)
plus the codec's header and Redis' per-key cost (NOTE [L2 sizing] in cachepipe/capacity.py),
a node holds its share of the samples (NOTE [warm-up partitions] in cachepipe/warmup.py)
and an L1 of what it reads (the whole source under global sampling, its partition under
node-local sampling), and a server serves at most one core's worth of GB/s (NOTE [a node's
L2] in cachepipe/server/embedded_group.py).

Example:
    >>> s = size_cache(files=1_281_167, file_bytes=110_000, cache_size=128, nodes=16, gpus_per_node=8,
    ...                images_per_s_per_gpu=3000, source_bytes_per_s=500e6)
    >>> s.sample_bytes, s.servers_per_node
    (65460, 2)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from cachepipe.capacity import L2_MARGIN, key_bytes
from cachepipe.config import CacheConfig
from cachepipe.decode import resized_shape
from cachepipe.l2.codec import encoded_size
from cachepipe.l2.store import namespace
from cachepipe.server.embedded_group import servers_for

__all__ = ["ASPECT", "CacheSizing", "size_cache"]

ASPECT = 4 / 3  # width / height of a typical ImageNet photo (most are 500 x 375 or 500 x 333)
_SIZING_HEIGHT = 3000  # a tall enough original that only the aspect, not rounding, sets the cached shape


@dataclass(frozen=True)
class CacheSizing:
    """One cached size of a data set on a cluster.

    Attributes:
        cache_size: the cached shorter side, px.
        sample_bytes: one sample in L2 (pixels, header, key).
        l2_bytes_per_node: L2 memory a node needs for its share, with the warm-up's margin.
        l1_bytes_per_node: L1 disk a node needs: a full mirror of the source under global
            sampling, its partition under node-local sampling (NOTE [L1 holds what the node
            reads] in cachepipe/warmup.py).
        warmup_s: the warm-up's source reads at the source's bandwidth (global: every node
            reads every file; node-local: each file is read once per job); decoding runs
            beside them on the nodes' cores.
        locality: ``"global"`` or ``"node"``, the sampling the figures assume.
        feed_bytes_per_s: what a node's GPUs read from L2 per second.
        servers_per_node: ``redis-server`` processes a node needs for that feed.
    """

    cache_size: int
    sample_bytes: int
    l2_bytes_per_node: int
    l1_bytes_per_node: int
    warmup_s: float
    feed_bytes_per_s: float
    servers_per_node: int
    locality: str = "global"


def size_cache(*, files: int, file_bytes: float, cache_size: int, nodes: int, gpus_per_node: int,
               images_per_s_per_gpu: float, source_bytes_per_s: float, aspect: float = ASPECT,
               locality: str = "global") -> CacheSizing:
    """Size one cached size of a data set of ``files`` files of ``file_bytes`` on average.

    Raises:
        ValueError: for a count, size, rate or aspect that is not positive.
    """
    for name, value in (("files", files), ("file_bytes", file_bytes), ("cache_size", cache_size),
                        ("nodes", nodes), ("gpus_per_node", gpus_per_node), ("aspect", aspect),
                        ("images_per_s_per_gpu", images_per_s_per_gpu), ("source_bytes_per_s", source_bytes_per_s)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    if locality not in ("global", "node"):
        raise ValueError(f"locality must be 'global' or 'node', got {locality!r}")
    readers = nodes if locality == "global" else 1  # nodes that read each file
    h, w = resized_shape(_SIZING_HEIGHT, round(_SIZING_HEIGHT * aspect), cache_size)
    keys = namespace(CacheConfig.prefix, "0" * 16, cache_size)
    sample = encoded_size(h, w) + key_bytes(keys)
    feed = gpus_per_node * images_per_s_per_gpu * sample
    return CacheSizing(cache_size=cache_size, sample_bytes=sample,
                       l2_bytes_per_node=int(math.ceil(files / nodes) * sample * L2_MARGIN),
                       l1_bytes_per_node=int((files if readers > 1 or nodes == 1 else math.ceil(files / nodes))
                                             * file_bytes),
                       warmup_s=readers * files * file_bytes / source_bytes_per_s,
                       feed_bytes_per_s=feed, servers_per_node=servers_for(feed), locality=locality)
