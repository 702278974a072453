"""The data side of ``cachepipe plan`` (cachepipe/sizing.py) against the cache's own rules."""
from __future__ import annotations

import io
import math

import pytest
from PIL import Image

from cachepipe.capacity import L2_MARGIN, key_bytes
from cachepipe.config import CacheConfig
from cachepipe.decode import decode_and_resize
from cachepipe.l2.codec import encoded_size
from cachepipe.l2.store import namespace
from cachepipe.server.embedded_group import servers_for
from cachepipe.sizing import size_cache


def _jpeg(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (120, 30, 200)).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.mark.parametrize("cache_size", [96, 128, 256])
def test_a_sample_is_what_decoding_a_4_3_photo_stores(cache_size):
    pixels = decode_and_resize(_jpeg(500, 375), cache_size)
    s = size_cache(files=1000, file_bytes=110e3, cache_size=cache_size, nodes=2, gpus_per_node=8,
                   images_per_s_per_gpu=1000, source_bytes_per_s=300e6)
    key = key_bytes(namespace(CacheConfig.prefix, "0" * 16, cache_size))
    assert s.sample_bytes == encoded_size(*pixels.shape[:2]) + key


def test_a_node_holds_its_share_with_the_warm_ups_margin_and_mirrors_every_file():
    s = size_cache(files=1_281_167, file_bytes=110e3, cache_size=128, nodes=16, gpus_per_node=8,
                   images_per_s_per_gpu=3000, source_bytes_per_s=500e6)
    assert s.l2_bytes_per_node == int(math.ceil(1_281_167 / 16) * s.sample_bytes * L2_MARGIN)
    assert s.l1_bytes_per_node == int(1_281_167 * 110e3)
    assert s.warmup_s == pytest.approx(16 * 1_281_167 * 110e3 / 500e6)
    assert s.feed_bytes_per_s == pytest.approx(8 * 3000 * s.sample_bytes)
    assert s.servers_per_node == servers_for(s.feed_bytes_per_s) == 2


def test_under_node_local_sampling_a_node_mirrors_its_partition_and_each_file_is_read_once():
    s = size_cache(files=1_281_167, file_bytes=110e3, cache_size=128, nodes=16, gpus_per_node=8,
                   images_per_s_per_gpu=3000, source_bytes_per_s=500e6, locality="node")
    assert s.l1_bytes_per_node == int(math.ceil(1_281_167 / 16) * 110e3)
    assert s.warmup_s == pytest.approx(1_281_167 * 110e3 / 500e6) and s.locality == "node"
    with pytest.raises(ValueError, match="locality"):
        size_cache(files=1, file_bytes=1, cache_size=8, nodes=1, gpus_per_node=1, images_per_s_per_gpu=1,
                   source_bytes_per_s=1, locality="nearby")


def test_servers_follow_the_rule_of_docs_cache_md():
    assert servers_for(8 * 3000 * 250e3) == 4  # the worked example: 6 GB/s at 0.33 s/GB, half a core each
    assert servers_for(1.0) == 1
    assert servers_for(1e9, s_per_gb=0.5, core_share=0.25) == 2


@pytest.mark.parametrize("bad", [{"files": 0}, {"cache_size": 0}, {"source_bytes_per_s": 0}, {"aspect": -1}])
def test_non_positive_inputs_are_refused(bad):
    kw = dict(files=10, file_bytes=1e3, cache_size=64, nodes=1, gpus_per_node=1, images_per_s_per_gpu=1,
              source_bytes_per_s=1e6) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        size_cache(**kw)
