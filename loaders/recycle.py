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

NOTE [batches sent to another process]: reference counts see only this process. A batch
put on a ``torch.multiprocessing`` queue (an async logger, a prefetching consumer) is
mapped by the receiver, while here its references drop back to idle once the queue's
feeder thread has pickled it: recycling it then overwrites the receiver's pixels (the stock
DataLoader, a fresh buffer per batch, has no such problem). The receiver's mapping leaves
no count the sender can read, but the sending does: torch pickles a shared storage with
``reduce_storage``, which stores a *new* weak reference under the storage's handle in its
``shared_cache`` (the same dict that mapped the worker's buffer here). So ``track`` notes
the entry a batch's storage has when it is handed out, and ``collect`` never gives back a
batch whose entry has been replaced since: it is forgotten (its worker allocates another
buffer) and its memory is freed once the receiver drops it. References are read first, the
entry second: a batch still being pickled is referenced by the pickler, so an idle one that
was sent has its new entry already. A false alarm (a pickle that failed after the storage)
only costs one buffer.
"""
from __future__ import annotations

import sys

import torch
from torch.multiprocessing import get_sharing_strategy
from torch.multiprocessing.reductions import fd_id, shared_cache

from loaders.shared_batches import release

__all__ = ["HandedOut"]


def _refs(t: torch.Tensor) -> tuple[int, int, int, int]:
    """(Python refs, C++ tensor refs, storage refs, Python refs of the storage object) of ``t``."""
    storage = t.untyped_storage()
    return sys.getrefcount(t), t._use_count(), torch._C._storage_Use_Count(storage._cdata), sys.getrefcount(storage)


def _share_key(storage: torch.UntypedStorage):
    """The key torch's ``shared_cache`` keeps ``storage`` under (as ``reduce_storage`` computes it)."""
    if get_sharing_strategy() == "file_system":
        return storage._share_filename_cpu_()[1]
    fd, _ = storage._share_fd_cpu_()  # the storage's own descriptor: not closed here
    return fd_id(fd)


def _idle_refs() -> tuple[int, int, int, int]:
    """``_refs`` of a tracked batch nobody else refers to: held by a list, its storage by a
    dict, seen from a loop over that list (as in ``collect``)."""
    pool, mapped = [torch.empty(1)], {}
    for buf in pool:
        mapped[0] = buf.untyped_storage()
        return _refs(buf)


def _indexed(items: list):
    """``enumerate(items)`` holding no reference to an item between steps (enumerate and zip keep
    their last result tuple, which would count as one more reference)."""
    for k in range(len(items)):
        yield k, items[k]


class HandedOut:
    """Shared batches given to the user, released to their worker once idle (NOTE above).

    Args:
        limit: most batches tracked; past it the oldest is forgotten without release (a
            user that keeps every batch makes the workers allocate, never overwrite).

    Attributes:
        released: batches given back to their worker so far.
        forgotten: batches never given back because they were sent to another process.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._out: list[torch.Tensor] = []
        self._sent: list[tuple] = []  # per batch of _out: (its key in shared_cache, the entry there)
        self._mapped: dict[int, tuple] = {}  # data_ptr -> (storage, its share key), kept mapped
        self._idle = _idle_refs()
        self.released = 0
        self.forgotten = 0

    def track(self, images: torch.Tensor) -> None:
        """Remember ``images`` (a batch about to be given to the user) until it is idle."""
        key = self._map(images.untyped_storage())
        if key is None:
            return  # made in this process (no workers): the user's to keep
        self._out.append(images)
        self._sent.append((key, shared_cache.get(key)))  # NOTE [batches sent to another process]
        if len(self._out) > self.limit:
            self._sent.pop(0)
            self._forget(self._out.pop(0))

    def keep_mapped(self, images: torch.Tensor) -> bool:
        """Keep the storage of ``images`` mapped for its next batch; False when it is not shared."""
        return self._map(images.untyped_storage()) is not None

    def _map(self, storage: torch.UntypedStorage):
        """Keep ``storage`` mapped; its key in torch's ``shared_cache``, None when it is not shared."""
        if not storage.is_shared():
            return None
        mapped = self._mapped.get(storage.data_ptr())
        if mapped is None:
            mapped = self._mapped[storage.data_ptr()] = storage, _share_key(storage)
            self._unmap_stale()
        return mapped[1]

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
        """Give every tracked batch that nobody else refers to back to its worker; forget one
        sent to another process since it was handed out (NOTE [batches sent to another process])."""
        busy, sent = [], []
        for k, images in _indexed(self._out):  # counted from a loop variable, like _idle_refs
            key, entry = self._sent[k]
            if _refs(images) != self._idle:
                busy.append(images)
                sent.append((key, entry))
            elif shared_cache.get(key) is not entry:  # pickled for another process: never recycled
                self._forget(images)
                self.forgotten += 1
            else:
                release(images)
                self.released += 1
            del images
        self._out, self._sent = busy, sent

    def clear(self) -> None:
        """Forget everything (the workers are gone)."""
        self._out.clear()
        self._sent.clear()
        self._mapped.clear()
