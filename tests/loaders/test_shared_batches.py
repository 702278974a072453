"""Recycled shared-memory batches: reused only after release, never while the consumer holds them."""
import torch

from loaders import cached_dataloader
from loaders.shared_batches import SharedBatchPool, release


def _batch(pool, shape=(2, 3, 4, 4)):
    storage = pool._storage(2 * 3 * 4 * 4)  # what batch() does inside a worker
    from loaders.shared_batches import _flag

    _flag(storage).fill_(0)
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, shape, torch.empty(shape).stride())


def test_pool_reuses_only_released_buffers():
    pool = SharedBatchPool(recycle=True, keep=3)
    a = _batch(pool)
    b = _batch(pool)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()  # a not released yet
    release(a)
    c = _batch(pool)
    assert c.untyped_storage().data_ptr() == a.untyped_storage().data_ptr() and pool.reused == 1
    d = _batch(pool)  # a/c busy again, b busy: a new buffer
    assert d.untyped_storage().data_ptr() not in {a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()}


def test_pool_without_recycle_never_reuses():
    pool = SharedBatchPool(recycle=False)
    a = _batch(pool)
    release(a)
    assert _batch(pool).untyped_storage().data_ptr() != a.untyped_storage().data_ptr() and pool.reused == 0


def test_release_ignores_foreign_tensors():
    t = torch.zeros(2, 3, dtype=torch.uint8)
    release(t)
    release(t.share_memory_())
    assert t.sum() == 0


def test_recycled_batches_keep_outputs_identical(tiny_dataset, tmp_path):
    root = tiny_dataset / "train"
    kw = dict(batch_size=4, train=True, size=16, cache_dir=tmp_path / "c", redis=False)
    workers = cached_dataloader(root, workers=1, prefetch_factor=2, **kw)
    inline = cached_dataloader(root, workers=0, **kw)
    try:
        kept = []
        for epoch in range(3):  # more batches than the pool holds: buffers get reused
            workers.set_epoch(epoch)
            inline.set_epoch(epoch)
            for (a, y), (b, z) in zip(workers, inline, strict=True):
                assert torch.equal(y, z) and torch.equal(a, b)
                kept.append((a.clone(), a))
        assert all(torch.equal(copy, a) for copy, a in kept)  # held batches were never overwritten
    finally:
        workers.close()
        inline.close()
