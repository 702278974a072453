"""The two ``external_source`` iterables of ``loaders.dali``: where DALI's batches come from.

- ``CropSource`` (CPU mode, the default there): uint8 crops made in worker processes.
- ``CacheSource`` (DALI's resize, the GPU graph): samples read on a thread here, with the
  crop windows, flips and resize targets as per-sample operator arguments.

Both follow NOTE [DALI epochs] (``loaders.dali``): ``iter()`` starts a pass over the epoch
the sampler holds then, ``abort`` ends one early, StopIteration ends the epoch.

NOTE [DALI CPU source]: in CPU mode the source is a ``CachedDataLoader`` making uint8
crops: ``workers`` processes read their batches from the cache and crop and flip them
(the cached loader's transform, same windows and flips for the same seed) into shared
memory, and ``external_source`` hands each batch to DALI as an NHWC view. DALI reads it
in place (``no_copy``: a copy would cost 7 % of the loader's CPU), so the
buffer goes back to its worker (NOTE [recycled shared batches]) only when DALI can no
longer read it: DALI asks for batch j only after it has output batch j - depth
(``prefetch_queue_depth``), and the source hands back the batches before that one. It
counts over epochs, so what was fed before an epoch ended (or failed) goes back later,
never early; a test fails if buffers go back one batch sooner.
Python threads in this process could not do that work in parallel: the GIL keeps them
below what worker processes reach (figures for both in ``docs/benchmarks/history/decisions.md``,
"Measurements behind design decisions"). Cache reads and counters (``skipped``,
``cache_wait_s``) come back with each batch; warnings of a read that degraded are
printed by the worker that made it. With ``workers=0`` the batch is read and cropped
here, when DALI asks for it.

NOTE [DALI read-ahead]: with DALI's resize (the GPU graph) the source runs on the thread
that iterates the loader, so a batch's MGET (a ~13 MB reply, mostly waiting on the server
and the socket) would stall everything else that thread does. While a batch is planned
and handed to DALI, the next batch of the epoch is already being read on one reader
thread; only that thread touches the cache, so the cache needs no locking.
``cache_wait_s`` is the time the source still waits for a read.
"""
from __future__ import annotations

import collections
import random
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from loaders.crop import CropWindow, center_crop_window
from loaders.dataloader import HIT_COUNTERS, CachedDataLoader
from loaders.folder import CachedImageFolder
from loaders.sampler import ShardedBatchSampler
from loaders.transforms import TrainTransform, ValTransform

__all__ = ["CacheSource", "CropSource"]


class CacheSource:
    """``external_source`` iterable: one batch per ``__next__`` from the cache (see NOTE [DALI epochs])."""

    def __init__(self, folder: CachedImageFolder, sampler: ShardedBatchSampler, train: bool) -> None:
        self.folder, self.sampler, self.train = folder, sampler, train
        self.reader = ThreadPoolExecutor(1, thread_name_prefix="dali-read")  # NOTE [DALI read-ahead]
        self._ahead: Future | None = None
        self.crop = TrainTransform()
        self.val = ValTransform()
        self._batches = None
        self.abort = False
        self.skipped: list[int] = []
        self.cache_wait_s = 0.0

    def __iter__(self):
        self.settle()
        self._batches, self.abort = None, False
        return self

    def settle(self) -> None:
        """Wait for a read-ahead the last pass left behind (its batch is never used)."""
        if self._ahead is not None:
            self._ahead.exception()  # an error there belongs to a batch nobody asked for
            self._ahead = None

    @property
    def cache_hits(self) -> dict[str, int]:
        stats = self.folder.cache.stats() if self.folder.cache is not None else {}
        return {name: stats.get(name, 0) for name in HIT_COUNTERS}  # this process reads

    def close(self) -> None:
        """Stop the reader thread and close the dataset's cache connections."""
        self.settle()
        self.reader.shutdown()
        self.folder.close()

    def _read_next(self) -> Future | None:
        """Start reading the next batch of the epoch on the reader thread (None: epoch over)."""
        request = next(self._batches, None)
        if request is None:
            return None
        return self.reader.submit(lambda: (request, self.folder.load_many(request, copy=False)))

    def __next__(self):
        if self._batches is None:
            self._batches = iter(self.sampler)
            self._ahead = self._read_next()
        if self.abort:
            raise StopIteration
        if self._ahead is None:
            raise StopIteration
        t0 = time.perf_counter()
        request, (samples, targets, skipped) = self._ahead.result()  # full: NOTE [replacing bad samples]
        self.cache_wait_s += time.perf_counter() - t0
        self._ahead = self._read_next()  # read the next batch while this one is processed
        self.skipped.extend(skipped)
        return (samples, *self.plan(samples, targets, request.size, random.Random(request.seed)))

    def plan(self, samples, targets, size: int, rng: random.Random) -> tuple[np.ndarray, ...]:
        """Per-sample operator arguments as one (N, k) array each (DALI takes a uniform batch as one array).

        Returns labels (N, 1), ROI start and end (N, 2) as (y, x), resize target (N, 2) as
        (h, w), mirror flags (N,), crop shape (N, 2) and relative crop position (N, 2).
        """
        n = len(samples)
        labels = np.asarray(targets, dtype=np.int64).reshape(n, 1)
        roi = np.zeros((n, 4), dtype=np.float32)
        resize = np.full((n, 2), size, dtype=np.float32)
        mirror = np.zeros(n, dtype=np.int32)
        crop = np.full((n, 2), size, dtype=np.float32)
        crop_pos = np.full((n, 2), 0.5, dtype=np.float32)
        for k, sample in enumerate(samples):
            h, w = sample.shape[:2]
            if self.train:
                win, flip = self.crop.plan(h, w, rng)
                mirror[k] = flip
            else:
                win = CropWindow(0, 0, h, w)
                rh, rw = self.val.resize_to(h, w, size)
                resize[k] = rh, rw
                c = center_crop_window(rh, rw, size)  # torchvision's anchor, as a relative position
                crop_pos[k] = (c.top / (rh - size) if rh > size else 0.5,
                               c.left / (rw - size) if rw > size else 0.5)
            roi[k] = win.top, win.left, win.top + win.height, win.left + win.width
        return labels, roi[:, :2].copy(), roi[:, 2:].copy(), resize, mirror, crop, crop_pos


class CropSource:
    """``external_source`` iterable for CPU mode: uint8 crops made in worker processes (NOTE [DALI CPU source])."""

    def __init__(self, crops: CachedDataLoader, depth: int) -> None:
        self.crops, self.depth = crops, depth
        self._batches = None
        self.abort = False
        self.fed = 0  # batches handed to DALI so far, over all epochs
        self._in_use: collections.deque = collections.deque()  # (number, images, arrays) DALI may still read

    def __iter__(self):
        self._batches, self.abort = None, False
        return self

    def __next__(self):
        if self._batches is None:
            self._batches = self.crops.transported()  # given back below, once DALI is done
        if self.abort:
            raise StopIteration
        # DALI asks for batch j only after it output batch j - depth: hand back the ones before
        # it (NOTE [DALI CPU source])
        while self._in_use and self._in_use[0][0] < self.fed - self.depth:
            self.crops.give_back(self._in_use.popleft()[1])
        images, labels = next(self._batches)
        arrays = images.permute(0, 2, 3, 1).numpy(), labels.numpy().reshape(-1, 1)  # channels-last: NHWC views
        self._in_use.append((self.fed, images, arrays))
        self.fed += 1
        return arrays

    def close(self) -> None:
        """Stop the workers and close the dataset's cache connections."""
        self._batches = None
        self.crops.close()
