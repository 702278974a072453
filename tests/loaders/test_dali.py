"""The DALI loader in CPU mode, end to end from a real Redis L2, against the torch path."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from cachepipe import CacheWarning, CorruptSampleError, TwoLevelCache
from loaders import build_dali_loader, cached_dataloader
from loaders.replacement import replacement_index
from loaders.transforms import normalize

SMALL = dict(cache_size=40)


def epoch(loader, e):
    loader.set_epoch(e)
    return [(x.clone(), y.clone()) for x, y in loader]


# Tolerances by who resizes in CPU mode (NOTE [DALI CPU resize]): the torch kernel in the
# source gives the torch path's pixels (normalisation rounding only); DALI's resampler, as
# on the GPU, may differ by one uint8 level (1 / 255 / std < 0.018) and more at crop borders.
EXACT = 1e-5


@pytest.mark.dali
@pytest.mark.parametrize("dali_resize", [None, True])
@pytest.mark.parametrize("size", [32, 35])  # 35: the resize to round(35 / 0.875) = 40 is a no-op; 32 resizes
def test_val_outputs_agree_with_the_torch_path(source, cache_dir, redis_server, size, dali_resize):
    kwargs = dict(batch_size=7, train=False, size=size, cache_dir=cache_dir, redis=[redis_server.url], **SMALL)
    dali = build_dali_loader(source, device="cpu", dali_resize=dali_resize, **kwargs)
    torch_loader = cached_dataloader(source, workers=0, **kwargs)
    try:
        a, b = epoch(dali, 0), epoch(torch_loader, 0)
        assert [len(y) for _, y in a] == [7, 7, 7, 3]  # the documented last partial batch
        for (xd, yd), (xt, yt) in zip(a, b):
            assert xd.shape == xt.shape == (len(yt), 3, size, size) and xd.dtype == torch.float32
            assert torch.equal(yd, yt) and yd.dtype == torch.int64
            diff = (xd - xt).abs()
            assert diff.max() < (0.02 if dali_resize else EXACT) and diff.mean() < 0.005
        assert redis_server.client().dbsize() == 24
    finally:
        dali.close()
        torch_loader.close()


@pytest.mark.dali
@pytest.mark.parametrize("dali_resize", [None, True])  # crops made by workers, or views read here and handed on
def test_shm_views_feed_dali_with_the_torch_paths_pixels(source, cache_dir, shm_url, dali_resize):
    kwargs = dict(batch_size=8, train=False, size=32, cache_dir=cache_dir, l2=[shm_url], **SMALL)
    with TwoLevelCache(source, cache_dir, l2=shm_url, cache_size=40, l2_memory="64mb") as cache:
        cache.get_many(range(len(cache)))  # the node's store, warm
    dali = build_dali_loader(source, device="cpu", dali_resize=dali_resize, workers=1, **kwargs)
    torch_loader = cached_dataloader(source, workers=0, **kwargs)
    try:
        for (xd, yd), (xt, yt) in zip(epoch(dali, 0), epoch(torch_loader, 0)):
            assert torch.equal(yd, yt) and (xd - xt).abs().max() < (0.02 if dali_resize else EXACT)
        assert dali.cache_hits["l2_hits"] == 24 and dali.cache_hits["l1_hits"] == 0
    finally:
        dali.close()
        torch_loader.close()


@pytest.mark.dali
@pytest.mark.parametrize("dali_resize", [None, True])
def test_train_crops_are_the_torch_paths_crops(source, cache_dir, dali_resize):
    kwargs = dict(batch_size=8, train=True, size=24, cache_dir=cache_dir, redis=False, seed=5, **SMALL)
    dali = build_dali_loader(source, device="cpu", dali_resize=dali_resize, **kwargs)
    torch_loader = cached_dataloader(source, workers=0, **kwargs)
    try:
        for e in (0, 1):
            a, b = epoch(dali, e), epoch(torch_loader, e)
            assert len(a) == len(b) == len(dali) == 3
            for (xd, yd), (xt, yt) in zip(a, b):
                assert torch.equal(yd, yt)
                diff = (xd - xt).abs()  # same windows and flips; other crops would give a mean of ~1
                if dali_resize:
                    assert diff.mean() < 0.02 and diff.quantile(0.99) < 0.2
                else:
                    assert diff.max() < EXACT
    finally:
        dali.close()
        torch_loader.close()


@pytest.mark.dali
@pytest.mark.parametrize("depth", [1, 2])
def test_worker_buffers_dali_reads_in_place_are_not_reused_too_early(source, cache_dir, depth):
    """NOTE [DALI CPU source]: DALI reads the workers' shared batches without copying them;
    a buffer handed back too early would be overwritten by a later batch before DALI read it."""
    kwargs = dict(batch_size=2, train=True, size=24, cache_dir=cache_dir, redis=False, seed=3, **SMALL)
    dali = build_dali_loader(source, device="cpu", workers=2, prefetch_queue_depth=depth, **kwargs)
    torch_loader = cached_dataloader(source, workers=0, **kwargs)
    try:
        for e in range(3):
            a, b = epoch(dali, e), epoch(torch_loader, e)
            assert len(a) == len(b) == 12
            for (xd, yd), (xt, yt) in zip(a, b):
                assert torch.equal(yd, yt) and (xd - xt).abs().max() < EXACT
    finally:
        dali.close()
        torch_loader.close()


@pytest.mark.dali
def test_epochs_sizes_ranks_and_resume_end_to_end(source, cache_dir):
    kwargs = dict(batch_size=3, train=True, size=24, cache_dir=cache_dir, redis=False, seed=2, workers=2, **SMALL)
    ranks = [build_dali_loader(source, device="cpu", shard_id=r, num_shards=2, **kwargs) for r in range(2)]
    try:
        e0 = [epoch(ld, 0) for ld in ranks]
        assert [len(b) for b in e0] == [4, 4]  # every rank stops on the same iteration
        labels0 = [torch.cat([y for _, y in b]).tolist() for b in e0]
        order = [[i for batch in ld.sampler for i in batch] for ld in ranks]
        assert sorted(order[0] + order[1]) == list(range(24))
        targets = ranks[0].dataset.targets
        assert labels0 == [[targets[i] for i in o] for o in order]
        # leave an epoch early, change the size, start the next one
        ranks[0].set_epoch(1)
        next(iter(ranks[0]))
        ranks[0].set_size(16)
        e1 = epoch(ranks[0], 1)
        assert len(e1) == 4 and {tuple(x.shape) for x, _ in e1} == {(3, 3, 16, 16)}
        # resume after two batches of epoch 1 on a fresh loader
        ranks[0].set_epoch(1)
        it = iter(ranks[0])
        next(it), next(it)
        state = ranks[0].state_dict()
    finally:
        for ld in ranks:
            ld.close()
    resumed = build_dali_loader(source, device="cpu", shard_id=0, num_shards=2, **kwargs)
    try:
        resumed.load_state_dict(state)
        resumed.set_epoch(1)
        rest = [(x.clone(), y.clone()) for x, y in resumed]
        assert len(rest) == 2
        for (xa, ya), (xb, yb) in zip(rest, e1[2:]):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)
    finally:
        resumed.close()


@pytest.mark.dali
def test_fp16_and_uint8_outputs_and_bad_arguments(source, cache_dir):
    loader = build_dali_loader(source, batch_size=4, train=False, size=24, device="cpu", cache_dir=cache_dir,
                               redis=False, dtype="float16", **SMALL)
    try:
        x, y = next(iter(loader))
        assert x.dtype == torch.float16 and x.shape == (4, 3, 24, 24)
    finally:
        loader.close()
    raw = build_dali_loader(source, batch_size=4, train=False, size=24, device="cpu", cache_dir=cache_dir,
                            redis=False, dtype="uint8", **SMALL)
    try:
        u8, _ = next(iter(raw))
        assert u8.dtype == torch.uint8
        torch.testing.assert_close(normalize(u8).half(), x, rtol=1e-3, atol=1e-2)
    finally:
        raw.close()
    with pytest.raises(ValueError, match="device"):
        build_dali_loader(source, batch_size=4, train=False, device="tpu", cache=False)
    with pytest.raises(ValueError, match="shard_id"):
        build_dali_loader(source, batch_size=4, train=False, device="cpu", cache=False, shard_id=1)


def test_loaders_import_without_dali_and_name_the_extra(source):
    code = textwrap.dedent(f"""
        import sys
        class NoDali:
            def find_spec(self, name, path=None, target=None):
                if name == "nvidia" or name.startswith("nvidia."):
                    raise ModuleNotFoundError("No module named " + repr(name))
        sys.meta_path.insert(0, NoDali())
        import loaders
        assert not loaders.dali_available()
        try:
            loaders.build_dali_loader({str(source)!r}, batch_size=2, train=False, device="cpu", cache=False)
        except ImportError as exc:
            print("ERR", exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'cachepipe[dali]'" in out.stdout


@pytest.mark.dali
@pytest.mark.parametrize("workers", [0, 2])  # the cache read in this process, or in source workers
def test_shard_killed_mid_epoch_degrades_to_l1_and_keeps_order(source, cache_dir, redis_servers, workers):
    shards = redis_servers(2)
    urls = [s.url for s in shards]
    with TwoLevelCache(source, cache_dir, redis=urls, cache_size=40) as cache:  # warm L1 and both shards
        cache.get_many(range(24))
    assert all(s.client().dbsize() > 0 for s in shards)
    batch = 2 if workers else 4  # more batches than DALI and the workers prefetch before the kill
    loader = build_dali_loader(source, batch_size=batch, train=True, size=24, device="cpu", cache_dir=cache_dir,
                               redis=urls, seed=1, workers=workers, **SMALL)
    try:
        reference = epoch(loader, 2)
        loader.set_epoch(2)
        got = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for x, y in loader:  # DALI and the workers already prefetch the next batches
                got.append((x.clone(), y.clone()))
                if len(got) == 1:
                    shards[0].kill()
        assert len(got) == len(reference) == 24 // batch
        for (xa, ya), (xb, yb) in zip(got, reference):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)
        assert loader.cache_hits["l1_hits"] > 0  # reads made in workers come back with their batches
        if not workers:  # workers warn on their own stderr
            assert any(issubclass(w.category, CacheWarning) and "shard" in str(w.message) for w in caught)
    finally:
        loader.close()


@pytest.mark.dali
@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_samples_are_replaced_and_counted_or_raise_naming_the_file(source, cache_dir, workers):
    bad = sorted((source / "class_0002").iterdir())[0]
    bad.write_bytes(b"\xff\xd8 truncated")
    kwargs = dict(batch_size=8, train=False, size=24, device="cpu", cache_dir=cache_dir, redis=False,
                  workers=workers, **SMALL)
    skip = build_dali_loader(source, on_error="skip", **kwargs)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batches = epoch(skip, 0)
        if not workers:  # workers warn on their own stderr
            assert any("skipped 1 bad" in str(w.message) for w in caught)
        bad_index = [p for p, _ in skip.dataset.samples].index(str(bad))
        assert [len(y) for _, y in batches] == [8, 8, 8]  # NOTE [replacing bad samples]: batches stay full
        assert skip.skipped == [bad_index]
        stand_in = replacement_index(f"0/0/0/{bad_index // 8}", bad_index, 0, 24)
        labels = torch.cat([y for _, y in batches]).tolist()
        targets = skip.dataset.targets
        assert labels == [targets[stand_in] if i == bad_index else t for i, t in enumerate(targets)]
    finally:
        skip.close()
    strict = build_dali_loader(source, **kwargs)
    try:
        with pytest.raises(CorruptSampleError, match=bad.name):  # from the source, through DALI, same type
            epoch(strict, 0)
    finally:
        strict.close()


@pytest.mark.dali
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("bad_class", ["class_0000", "class_0002"])  # in the first batch, or in the fifth of six
def test_a_pass_that_failed_is_not_followed_by_a_silently_empty_one(source, cache_dir, workers, bad_class):
    """NOTE [DALI after an error]: the next pass runs on a new pipeline and yields the same batches."""
    bad = sorted((source / bad_class).iterdir())[0]
    bad.write_bytes(b"\xff\xd8 truncated")
    loader = build_dali_loader(source, batch_size=4, train=False, size=24, device="cpu", cache_dir=cache_dir,
                               redis=False, workers=workers, **SMALL)
    try:
        passes = []
        for _ in range(2):
            got = []
            with pytest.raises(CorruptSampleError, match=bad.name):
                for x, y in loader:
                    got.append((x.clone(), y.clone()))
            passes.append(got)
        assert len(passes[0]) == len(passes[1])  # the error surfaces up to prefetch_queue_depth batches early
        for (xa, ya), (xb, yb) in zip(*passes):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)
    finally:
        loader.close()
