"""CachedImageFolder: torchvision's dataset rules, cached vs uncached pixels, batches, bad input."""
from __future__ import annotations

import os
import shutil
import warnings

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


def test_empty_root_and_empty_class_raise_file_not_found_as_torchvision(tmp_path, source):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "stray.jpg").write_bytes(b"x")
    with pytest.raises(FileNotFoundError) as theirs:
        torchvision_image_folder(str(empty))
    with pytest.raises(FileNotFoundError, match=r"stray\.jpg") as info:
        CachedImageFolder(empty, cache=False)
    assert str(info.value).startswith(str(theirs.value))  # NOTE [torchvision's messages]: theirs first
    assert isinstance(info.value, ValueError)  # code written against earlier cachepipe still catches it
    (source / "class_9999").mkdir()
    (source / "class_9999" / "readme.txt").write_text("no images here")
    with pytest.raises(FileNotFoundError) as theirs:
        torchvision_image_folder(str(source))
    for cache in (False, None):
        with pytest.raises(FileNotFoundError, match=r"1 of 5 class folders") as info:
            CachedImageFolder(source, cache=cache, cache_dir=source.parent / "cache")
        assert str(info.value).startswith(str(theirs.value))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CachedImageFolder(tmp_path / "missing", cache=False)


@pytest.mark.parametrize("cache", ["files", "cache"])
def test_allow_empty_keeps_the_empty_class_as_torchvision(source, cache_dir, cache):
    (source / "class_9999").mkdir()
    (source / "class_9999" / "readme.txt").write_text("no images here")
    kwargs = dict(cache=False) if cache == "files" else dict(cache_dir=cache_dir, redis=False)
    ds = CachedImageFolder(source, allow_empty=True, cache_size=32, **kwargs)
    classes, class_to_idx, samples = torchvision_image_folder(str(source), allow_empty=True)
    assert ds.classes == classes and ds.class_to_idx == class_to_idx and ds.samples == samples
    assert "class_9999" in ds.classes and ds.class_to_idx["class_9999"] not in ds.targets
    assert ds[len(ds) - 1][0].shape[2] == 3


@pytest.mark.parametrize("cache", ["files", "cache"])
def test_extensions_and_is_valid_file_choose_files_as_torchvision(odd_tree, cache_dir, cache):
    kwargs = dict(cache=False) if cache == "files" else dict(cache_dir=cache_dir, redis=False)
    some = CachedImageFolder(odd_tree, extensions=(".png", ".bmp"), cache_size=16, **kwargs)
    assert some.samples == torchvision_image_folder(str(odd_tree), extensions=(".png", ".bmp"))[2]
    assert [os.path.basename(p) for p, _ in some.samples] == ["img.PNG", "2.bmp", "z.png"]

    def no_deep_files(path):
        return path.lower().endswith((".jpg", ".jpeg", ".png", ".bmp")) and "deeper" not in path

    chosen = CachedImageFolder(odd_tree, is_valid_file=no_deep_files, cache_size=16, **kwargs)
    assert chosen.samples == torchvision_image_folder(str(odd_tree), is_valid_file=no_deep_files)[2]
    assert len(chosen) == 6 and not any("deeper" in p for p, _ in chosen.samples)
    plain = CachedImageFolder(odd_tree, cache=False, cache_size=16)
    for i, (path, _) in enumerate(chosen.samples):
        assert np.array_equal(chosen[i][0], plain[[p for p, _ in plain.samples].index(path)][0])
    with pytest.raises(ValueError, match="cannot both"):
        CachedImageFolder(odd_tree, extensions=(".png", ".bmp"), is_valid_file=no_deep_files, cache=False)


def test_a_filtered_cache_leaves_the_default_manifest_alone(odd_tree, cache_dir):
    CachedImageFolder(odd_tree, extensions=(".png", ".bmp"), cache_dir=cache_dir, redis=False)
    assert len(CachedImageFolder(odd_tree, cache_dir=cache_dir, redis=False)) == 7
    assert len(CachedImageFolder(odd_tree, extensions=(".png", ".bmp"), cache_dir=cache_dir, redis=False)) == 3
    assert len(CachedImageFolder(odd_tree, cache_dir=cache_dir, redis=False)) == 7
    shared = CachedImageFolder(odd_tree, cache_dir=cache_dir, redis=False).cache
    with pytest.raises(ValueError, match="other files"):
        CachedImageFolder(odd_tree, extensions=(".png", ".bmp"), cache=shared)


def test_custom_loader_is_honoured_without_the_cache(source, cache_dir):
    calls = []

    def loader(path):
        calls.append(path)
        with Image.open(path) as img:
            return img.convert("L")

    with pytest.warns(UserWarning, match=r"cache is\s+not used"):
        ds = CachedImageFolder(source, loader=loader, cache_dir=cache_dir)
    assert ds.cache is None and "loader" in repr(ds)
    img, target = ds[3]
    assert calls == [ds.samples[3][0]] and img.mode == "L" and target == ds.targets[3]
    batch = ds.__getitems__([0, 1])
    assert [b[0].mode for b in batch] == ["L", "L"] and len(calls) == 3
    # cache=False says it on purpose: no cache_dir needed, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = CachedImageFolder(source, lambda im: im.size, None, loader, cache=False)
    with Image.open(quiet.samples[0][0]) as ref:
        assert quiet[0][0] == ref.size


def test_custom_loader_errors_pass_through_or_are_replaced(source):
    bad = sorted((source / "class_0001").iterdir())[2]
    bad.write_bytes(b"not an image")

    def loader(path):
        with Image.open(path) as img:
            return img.convert("RGB")

    ds = CachedImageFolder(source, loader=loader, cache=False)
    bad_index = [p for p, _ in ds.samples].index(str(bad))
    with pytest.raises(OSError):  # PIL's UnidentifiedImageError, as from torchvision's ImageFolder
        ds.__getitems__([0, bad_index])
    skipping = CachedImageFolder(source, loader=loader, cache=False, on_error="skip")
    with pytest.warns(RuntimeWarning, match=bad.name):
        batch = skipping.__getitems__([0, bad_index, 1])
    assert len(batch) == 3 and all(img.mode == "RGB" for img, _ in batch)  # replaced: the batch stays full
    assert skipping.skipped == [bad_index]


def test_output_pil_runs_a_torchvision_style_pipeline_unchanged(source, cache_dir):
    def pil_pipeline(img):  # what torchvision's Resize + Grayscale + ToTensor need: PIL methods
        img = img.resize((24, 24), Image.BILINEAR).convert("L")
        return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0)[None]

    arrays = CachedImageFolder(source, cache_dir=cache_dir, redis=False, cache_size=40)
    pil = CachedImageFolder(source, pil_pipeline, lambda t: t + 100, cache_dir=cache_dir, redis=False,
                            cache_size=40, output="pil")
    raw = CachedImageFolder(source, cache_dir=cache_dir, redis=False, cache_size=40, output="pil")
    img, target = raw[5]
    assert isinstance(img, Image.Image) and img.mode == "RGB" and np.array_equal(np.asarray(img), arrays[5][0])
    assert target == arrays.targets[5]
    loader = torch.utils.data.DataLoader(pil, batch_size=8, num_workers=0)
    images, labels = next(iter(loader))
    assert images.shape == (8, 1, 24, 24) and labels.tolist() == [t + 100 for t in pil.targets[:8]]
    assert isinstance(pil.load(0), np.ndarray)  # the batch path (cached_dataloader) stays numpy
    with pytest.raises(ValueError, match="output"):
        CachedImageFolder(source, cache=False, output="tensor")


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


class _TwoClasses(CachedImageFolder):
    """A subclass choosing its classes and labels, as torchvision's DatasetFolder lets it."""

    def find_classes(self, directory):
        self.asked = directory
        return ["b", "C"], {"b": 0, "C": 1}


@pytest.mark.parametrize("cache", ["files", "cache"])
def test_a_find_classes_override_chooses_classes_and_labels_as_torchvision(odd_tree, cache_dir, cache):
    kwargs = dict(cache=False) if cache == "files" else dict(cache_dir=cache_dir, redis=False)
    ds = _TwoClasses(odd_tree, cache_size=16, **kwargs)
    classes, _, every = torchvision_image_folder(str(odd_tree))
    label = {"b": 0, "C": 1}  # torchvision walks sorted(class_to_idx): C's files, then b's
    expected = [(p, label[classes[t]]) for p, t in every if classes[t] in label]
    assert ds.asked == str(odd_tree) and ds.classes == ["b", "C"] and ds.class_to_idx == label
    assert ds.samples == expected and ds.targets == [t for _, t in expected] and len(ds) == 5
    plain = CachedImageFolder(odd_tree, cache=False, cache_size=16)
    paths = [p for p, _ in plain.samples]
    for i, (path, target) in enumerate(expected):
        img, t = ds[i]
        assert t == target and np.array_equal(img, plain[paths.index(path)][0])
    if cache == "cache":  # its own manifest and namespace; the default one still serves all 7
        assert ds.manifest.fingerprint != CachedImageFolder(odd_tree, **kwargs).manifest.fingerprint
        assert len(CachedImageFolder(odd_tree, **kwargs)) == 7


def test_find_classes_labels_must_be_0_to_n_minus_1(odd_tree):
    class Gaps(CachedImageFolder):
        def find_classes(self, directory):
            return ["a", "b"], {"a": 0, "b": 5}

    with pytest.raises(ValueError, match=r"find_classes\(\) must label its 2 classes 0\.\.1"):
        Gaps(odd_tree, cache=False)
    assert CachedImageFolder(odd_tree, cache=False).find_classes(odd_tree) == (
        ["C", "a", "b"], {"C": 0, "a": 1, "b": 2})  # torchvision's method, with cachepipe's link rules


@pytest.mark.parametrize("output", ["numpy", "pil"])
def test_loader_is_a_callable_giving_the_datasets_sample_on_the_cache_path(source, cache_dir, output):
    import pickle

    ds = CachedImageFolder(source, cache_dir=cache_dir, redis=False, cache_size=24, output=output)
    assert callable(ds.loader)  # torchvision's attribute: what turns a path into a sample
    path, target = ds.samples[2]
    sample, label = ds[2]
    assert label == target and np.array_equal(np.asarray(ds.loader(path)), np.asarray(sample))
    assert isinstance(ds.loader(path), Image.Image if output == "pil" else np.ndarray)
    again = pickle.loads(pickle.dumps(ds.loader))
    assert np.array_equal(np.asarray(again(path)), np.asarray(sample))
