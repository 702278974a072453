"""Bytes of tensor storage that torch operations allocate and keep alive, counted as they run.

``tracemalloc`` does not see torch's allocator and RSS mixes in everything else a process
holds, so :class:`LiveBytes` counts storages directly: a ``TorchDispatchMode`` notes the
storage of every tensor an operation returns (factory functions included) and watches it
through a weak reference to the C++ storage, so a storage is counted once however many
views it has and stops counting when its last view is gone. Tensors made before the mode
was entered (a bucket handed to an exchange, a residual kept from an earlier step) are not
counted: what it measures is the working memory of the code run inside it.

Example:
    >>> with LiveBytes() as probe:                      # doctest: +SKIP
    ...     ex.exchange(flat)
    >>> probe.peak, probe.live                          # bytes: at most at once, still held
"""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["LiveBytes"]


class LiveBytes(TorchDispatchMode):
    """Live and peak bytes of the storages created by the operations run inside the mode.

    Attributes:
        live: bytes of counted storages still alive (as of the last operation, or now via
            :meth:`current`).
        peak: the most that was alive at once, checked after every operation.
        allocated: bytes of every storage counted (a measure of allocation traffic).
    """

    def __init__(self):
        super().__init__()
        self._refs: dict[int, tuple[StorageWeakRef, int]] = {}
        self.live = self.peak = self.allocated = 0

    def current(self) -> int:
        """Bytes of counted storages alive now (expired ones are forgotten)."""
        for key in [k for k, (ref, _) in self._refs.items() if ref.expired()]:
            del self._refs[key]
        self.live = sum(n for _, n in self._refs.values())
        return self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if _counted(t)}
        added = False
        for t in tree_leaves(out):
            if not _counted(t):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in inputs:  # in place, or a view: no new memory (and maybe not ours)
                continue
            known = self._refs.get(key)
            if known is None or known[0].expired():
                self._refs[key] = (StorageWeakRef(storage), storage.nbytes())
                self.allocated += storage.nbytes()
                added = True
        if added:
            self.peak = max(self.peak, self.current())
        return out


def _counted(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type != "meta"
