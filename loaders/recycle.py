"""Give the workers' shared batches to the user, and back to their worker once nobody refers to them.

NOTE [handing out shared batches]: on CPU a DataLoader worker writes the final batch
(normalised float, or raw uint8, in the layout asked for) into a recycled shared-memory
buffer (NOTE [recycled shared batches]) and the training process yields that very buffer:
no copy and no arithmetic on the training thread. The buffer goes back to its worker once
nothing outside this tracker refers to it: its Python reference count, the C++ reference
count of its tensor (autograd's saved tensors hold those) and the reference count of its
storage (views) are all what they are when only the tracker holds it. A batch the user
keeps (in a list, saved for backward, as a view) is therefore never overwritten; its
worker allocates another buffer meanwhile. Reference counts prove a CPU buffer idle
because every CPU read of it is over when the op that reads it returns; so does a copy from
such pageable memory to a GPU (CUDA stages it before returning). A copy that can still be
in flight when the host lets go of the buffer (from pinned memory) needs a fence instead:
NOTE [staging ring].

The tracker also keeps each buffer's storage mapped between its batches, so that torch's
shared-memory cache hands the same mapping back for the buffer's next batch instead of
mapping it again and faulting every page in.
"""
from __future__ import annotations

import sys

import torch

from loaders.shared_batches import release

__all__ = ["HandedOut"]


def _refs(t: torch.Tensor) -> tuple[int, int, int, int]:
    """(Python refs, C++ tensor refs, storage refs, Python refs of the storage object) of ``t``."""
    storage = t.untyped_storage()
    return sys.getrefcount(t), t._use_count(), torch._C._storage_Use_Count(storage._cdata), sys.getrefcount(storage)


def _idle_refs() -> tuple[int, int, int, int]:
    """``_refs`` of a tracked batch nobody else refers to: held by a list, its storage by a
    dict, seen from a loop over that list (as in ``collect``)."""
    pool, mapped = [torch.empty(1)], {}
    for buf in pool:
        mapped[0] = buf.untyped_storage()
        return _refs(buf)


class HandedOut:
    """Shared batches given to the user, released to their worker once idle (NOTE above).

    Args:
        limit: most batches tracked; past it the oldest is forgotten without release (a
            user that keeps every batch makes the workers allocate, never overwrite).

    Attributes:
        released: batches given back to their worker so far.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._out: list[torch.Tensor] = []
        self._mapped: dict[int, torch.UntypedStorage] = {}  # data_ptr -> storage, kept mapped
        self._idle = _idle_refs()
        self.released = 0

    def track(self, images: torch.Tensor) -> None:
        """Remember ``images`` (a batch about to be given to the user) until it is idle."""
        if not self.keep_mapped(images):
            return  # made in this process (no workers): the user's to keep
        self._out.append(images)
        if len(self._out) > self.limit:
            self._forget(self._out.pop(0))

    def keep_mapped(self, images: torch.Tensor) -> bool:
        """Keep the storage of ``images`` mapped for its next batch; False when it is not shared."""
        storage = images.untyped_storage()
        if not storage.is_shared():
            return False
        if storage.data_ptr() not in self._mapped:
            self._mapped[storage.data_ptr()] = storage
            self._unmap_stale()
        return True

    def _unmap_stale(self) -> None:
        """Keep at most ``limit`` storages mapped, dropping the oldest not out with the user."""
        while len(self._mapped) > self.limit:
            out = {t.untyped_storage().data_ptr() for t in self._out}
            stale = next((p for p in self._mapped if p not in out), None)
            if stale is None:
                return
            del self._mapped[stale]

    def _forget(self, images: torch.Tensor) -> None:
        self._mapped.pop(images.untyped_storage().data_ptr(), None)

    def collect(self) -> None:
        """Give every tracked batch that nobody else refers to back to its worker."""
        busy = []
        for images in self._out:  # counted from a loop variable, like _idle_refs
            if _refs(images) == self._idle:
                release(images)
                self.released += 1
            else:
                busy.append(images)
            del images
        self._out = busy

    def clear(self) -> None:
        """Forget everything (the workers are gone)."""
        self._out.clear()
        self._mapped.clear()
