"""Output batches in shared memory for DataLoader workers, recycled once the consumer releases them.

NOTE [recycled shared batches]: a worker writes each batch into shared memory so that
sending it to the training process copies nothing. A fresh shared buffer per batch costs
a page fault per 4 KiB page on both sides, a tenth of the cached loader's CPU time
(``docs/benchmarks/history/decisions.md``, "Measurements behind design decisions"). So each worker
keeps a few buffers and reuses one only after the consumer has said it is done with it:
every buffer has one trailing flag byte after the batch, which the worker sets to 0 when it
hands the batch out and the consumer sets to 1 (``release``) once it has read the pixels.
Only the loaders' internal uint8 transport uses this: ``CachedDataLoader`` normalises the
batch into its own float buffer and then releases it, the DALI loader's CPU source once
DALI can no longer read it (NOTE [DALI CPU source]); a batch given to the user is never
released, so it is never overwritten. A batch that is not released (pinned copies, an
abandoned epoch) just makes the worker allocate a new buffer.
"""
from __future__ import annotations

import torch
import torch.utils.data

__all__ = ["SharedBatchPool", "release"]

_FREE, _BUSY = 1, 0


def _flag(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(storage, storage.nbytes() - 1, (1,), (1,))


class SharedBatchPool:
    """A worker's shared-memory output batches (see NOTE [recycled shared batches]).

    Args:
        recycle: reuse released buffers (only when the consumer calls ``release``).
        keep: most buffers kept per worker (default 6: prefetch plus the one being read).

    Attributes:
        reused, allocations: buffers reused and allocated so far.
    """

    def __init__(self, recycle: bool, keep: int = 6) -> None:
        self.recycle, self.keep = recycle, keep
        self._pool: list[torch.UntypedStorage] = []
        self.reused = 0
        self.allocations = 0

    def _storage(self, nbytes: int) -> torch.UntypedStorage:
        if self.recycle:
            for storage in self._pool:
                if storage.nbytes() == nbytes + 1 and _flag(storage).item() == _FREE:
                    self.reused += 1
                    return storage
        storage = torch.UntypedStorage._new_shared(nbytes + 1)
        self.allocations += 1
        if self.recycle:
            if len(self._pool) >= self.keep:
                self._pool.pop(0)
            self._pool.append(storage)
        return storage

    def batch(self, shape, dtype: torch.dtype, channels_last: bool) -> torch.Tensor | None:
        """An empty output batch in shared memory, or None outside a DataLoader worker."""
        if torch.utils.data.get_worker_info() is None:
            return None
        layout = torch.channels_last if channels_last else torch.contiguous_format
        meta = torch.empty(shape, dtype=dtype, memory_format=layout, device="meta")
        storage = self._storage(meta.numel() * meta.element_size())
        _flag(storage).fill_(_BUSY)
        return torch.empty(0, dtype=dtype).set_(storage, 0, meta.shape, meta.stride())


def release(batch: torch.Tensor) -> None:
    """Consumer side: the pixels of ``batch`` (from a recycling pool) were read; its worker may reuse it.

    A no-op for tensors whose storage has no flag byte after their data (not from a pool).
    """
    storage = batch.untyped_storage()
    if storage.is_shared() and storage.nbytes() == batch.numel() * batch.element_size() + 1:
        _flag(storage).fill_(_FREE)
