"""CachedImageFolder: torchvision's dataset rules, cached vs uncached pixels, batches, bad input."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from cachepipe import CorruptSampleError
from loaders import CachedImageFolder
from loaders.replacement import replacement_index
from loaders.transforms import ValTransform
from tests.torchvision_reference import torchvision_image_folder


def write_image(path, seed, size=(20, 16)):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    fmt = {".png": "PNG", ".bmp": "BMP"}.get(path.suffix.lower(), "JPEG")
    Image.fromarray(pixels).save(path, format=fmt)


@pytest.fixture
def odd_tree(tmp_path):
    """Class names that sort by code point, nested folders, mixed-case extensions, non-images."""
    root = tmp_path / "tree"
    files = ["b/x1.JPG", "b/sub/deeper/z.png", "b/sub/a.jpeg", "a/2.bmp", "a/10.JPEG", "C/img.PNG", "C/z/y.jpg"]
    for n, rel in enumerate(files):
        write_image(root / rel, n)
    (root / "a" / "notes.txt").write_text("not an image")
    (root / "C" / "noext").write_bytes(b"x")
    (root / "README").write_text("a file at the top is not a class")
    return root


@pytest.mark.parametrize("cache", ["files", "cache"])
def test_classes_targets_and_order_follow_torchvision(odd_tree, cache_dir, cache):
    kwargs = dict(cache=False) if cache == "files" else dict(cache_dir=cache_dir, redis=False)
    ds = CachedImageFolder(odd_tree, **kwargs)
    classes, class_to_idx, samples = torchvision_image_folder(str(odd_tree))
    assert ds.classes == classes == ["C", "a", "b"]
    assert ds.class_to_idx == class_to_idx
    assert ds.samples == samples and ds.imgs == samples
    assert ds.targets == [t for _, t in samples]
    assert all(os.path.isabs(p) for p, _ in ds.samples) and len(ds) == 7


def test_cached_pixels_equal_uncached_and_batches_equal_items(source, cache_dir, redis_server):
    plain = CachedImageFolder(source, cache=False, cache_size=64)
    cached = CachedImageFolder(source, cache_dir=cache_dir, redis=[redis_server.url], cache_size=64)
    idx = [5, 0, 17, 5, 23]
    batch = cached.__getitems__(idx)
    for i, (sample, target) in zip(idx, batch):
        ref, ref_target = plain[i]
        assert sample.dtype == np.uint8 and min(sample.shape[:2]) == 64
        assert np.array_equal(sample, ref) and target == ref_target == cached.targets[i]
    # the second read of the batch comes from L2 and is still identical
    again = cached.__getitems__(idx)
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(batch, again))
    assert cached.cache.stats()["l2_hits"] >= len(set(idx))


def test_torch_dataloader_fetches_each_batch_with_one_mget_per_shard(source, cache_dir, redis_servers):
    shards = redis_servers(2)
    ds = CachedImageFolder(source, ValTransform(size=32), target_transform=lambda t: t * 10,
                           cache_dir=cache_dir, redis=[s.url for s in shards], cache_size=40)
    loader = torch.utils.data.DataLoader(ds, batch_size=24, shuffle=False, num_workers=0)
    for s in shards:
        s.client().config_resetstat()
    images, labels = next(iter(loader))
    assert images.shape == (24, 3, 32, 32) and labels.tolist() == [t * 10 for t in ds.targets]
    mgets = sum(int(s.client().info("commandstats").get("cmdstat_mget", {}).get("calls", 0)) for s in shards)
    assert 1 <= mgets <= 2  # one round trip per shard holding part of the batch, not one per sample


def test_empty_root_and_empty_class_say_what_was_found(tmp_path, source):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "stray.jpg").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"no class folders.*stray\.jpg"):
        CachedImageFolder(empty, cache=False)
    (source / "class_9999").mkdir()
    (source / "class_9999" / "readme.txt").write_text("no images here")
    with pytest.raises(ValueError, match=r"1 of 5 class folders.*class_9999"):
        CachedImageFolder(source, cache=False)
    with pytest.raises(FileNotFoundError):
        CachedImageFolder(tmp_path / "missing", cache=False)


@pytest.mark.parametrize("cache", ["files", "cache"])
def test_corrupt_sample_raises_naming_the_file_or_is_replaced_and_counted(source, cache_dir, cache):
    bad = sorted((source / "class_0001").iterdir())[2]
    bad.write_bytes(b"definitely not a JPEG" * 10)
    kwargs = dict(cache=False) if cache == "files" else dict(cache_dir=cache_dir, redis=False)
    ds = CachedImageFolder(source, cache_size=32, **kwargs)
    bad_index = [p for p, _ in ds.samples].index(str(bad))
    with pytest.raises(CorruptSampleError, match=bad.name) as info:
        ds.__getitems__([0, bad_index, 1])
    assert info.value.index == bad_index
    with pytest.raises(CorruptSampleError, match=bad.name):
        ds[bad_index]
    skipping = CachedImageFolder(source, cache_size=32, on_error="skip", **kwargs)
    with pytest.warns(RuntimeWarning, match=bad.name):
        batch = skipping.__getitems__([0, bad_index, 1])
    stand_in = replacement_index("", bad_index, 0, len(skipping))  # the batch stays full
    assert [t for _, t in batch] == [skipping.targets[0], skipping.targets[stand_in], skipping.targets[1]]
    assert skipping.skipped == [bad_index]


def test_bad_arguments(source, odd_tree, cache_dir):
    with pytest.raises(ValueError, match="on_error"):
        CachedImageFolder(source, cache=False, on_error="ignore")
    with pytest.raises(ValueError, match="cache_dir"):
        CachedImageFolder(source)
    other = CachedImageFolder(odd_tree, cache_dir=cache_dir, redis=False).cache
    with pytest.raises(ValueError, match="serves"):
        CachedImageFolder(source, cache=other)


def test_index_errors_and_repr(source):
    ds = CachedImageFolder(source, cache=False, cache_size=32)
    with pytest.raises(IndexError):
        ds[len(ds)]
    assert np.array_equal(ds[-1][0], ds[len(ds) - 1][0])
    assert "samples=24" in repr(ds) and "files" in repr(ds)
    shutil.rmtree(source / "class_0000")  # the dataset keeps its manifest; reading a gone file fails clearly
    with pytest.raises(FileNotFoundError):
        ds[0]
