"""CachedImageFolder's lazy sample lists (NOTE [lazy sample lists]) and its workers under every
start method: each maps the saved manifest (NOTE [manifest pickles as its path])."""
from __future__ import annotations

import collections.abc
import os
import pickle

import numpy as np
import pytest
import torch.utils.data

from cachepipe import CacheConfig
from loaders import CachedImageFolder
from tests.torchvision_reference import torchvision_image_folder
from tools.bench.parts.scale_tree import build_tree


def test_samples_and_targets_keep_torchvision_contract(source, cache_dir):
    ds = CachedImageFolder(source, cache_dir=cache_dir, redis=False, cache_size=16)
    classes, class_to_idx, instances = torchvision_image_folder(str(source))
    assert (ds.classes, ds.class_to_idx) == (classes, class_to_idx)
    assert isinstance(ds.samples, collections.abc.Sequence) and ds.imgs is ds.samples
    assert ds.samples == instances and list(ds.samples) == instances and instances == ds.samples
    assert ds.samples[-1] == instances[-1] and ds.samples[2:5] == instances[2:5] and len(ds.samples) == len(instances)
    assert ds.targets == [t for _, t in instances] and ds.targets[::7] == [t for _, t in instances][::7]
    assert all(type(t) is int for t in ds.targets) and instances[3] in ds.samples
    assert np.asarray(ds.targets).tolist() == [t for _, t in instances]
    with pytest.raises(IndexError):
        ds.samples[len(instances)]
    ds.samples = ds.samples[:4]  # torchvision code that narrows the list keeps working
    assert len(ds.samples) == 4


def test_pickled_dataset_is_the_same_size_at_any_n(tmp_path):
    sizes = []
    for n in (30, 3000):
        root = build_tree(tmp_path / f"t{n}", n, classes=3, side=8)
        ds = CachedImageFolder(root, cache=CacheConfig(root, tmp_path / f"c{n}", False, 8))
        sizes.append(len(pickle.dumps(ds)))
    assert sizes[1] - sizes[0] < 64 and sizes[1] < 4000  # a path, never 3,000 entries


class _Probe(torch.utils.data.Dataset):
    """What a worker sees of a CachedImageFolder."""

    def __init__(self, folder: CachedImageFolder) -> None:
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int):
        m = self.folder.manifest
        return (os.getpid(), str(m.file.path), m is self.folder.cache.manifest, self.folder.samples[i],
                self.folder.targets[i], self.folder.load(i))


def _as_list(batch):
    return batch


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_workers_map_the_saved_manifest_under_every_start_method(source, cache_dir, redis_server, context):
    ds = CachedImageFolder(source, cache_dir=cache_dir, redis=[redis_server.url], cache_size=16)
    loader = torch.utils.data.DataLoader(_Probe(ds), batch_size=8, num_workers=1, collate_fn=_as_list,
                                         multiprocessing_context=context)
    got = [row for batch in loader for row in batch]
    assert len(got) == len(ds)
    for i, (pid, path, shared, sample, target, pixels) in enumerate(got):
        assert pid != os.getpid() and path == str(ds.manifest.file.path) and shared
        assert sample == ds.samples[i] and target == ds.targets[i]
        np.testing.assert_array_equal(pixels, ds.load(i))
