"""``cached_dataloader``: torch's DataLoader over the cache, batch-at-a-time, rank-sharded and resumable."""
from __future__ import annotations

import ctypes
import dataclasses
import gc
import os
import random
import time
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.utils.data

from loaders.dead_workers import MAX_RESTARTS, detect_in_next, is_dead_worker, shut_down
from loaders.device_feed import DeviceFeed, resolve_device
from loaders.folder import CachedImageFolder
from loaders.locality import DEFAULT_EXCHANGE_FRACTION, check_locality, node_locality
from loaders.recycle import HandedOut
from loaders.sampler import BatchRequest, SamplerControls, ShardedBatchSampler
from loaders.shared_batches import SharedBatchPool, release
from loaders.transforms import make_transform

__all__ = ["CachedDataLoader", "cached_dataloader", "resolve_rank"]


def resolve_rank(distributed) -> tuple[int, int]:
    """(rank, world_size) from ``distributed``: None = torch.distributed if initialised, else (0, 1);
    False = (0, 1); a (rank, world_size) pair is used as given.

    Raises:
        ValueError: for anything else or an out-of-range pair.
    """
    if distributed is None:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if distributed is False:
        return 0, 1
    try:
        rank, world = (int(v) for v in distributed)
    except (TypeError, ValueError):
        raise ValueError(f"distributed must be None, False or (rank, world_size); got {distributed!r}") from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world_size; got distributed={distributed!r}")
    return rank, world


def _keep_freed_memory(worker_id: int = 0) -> None:
    """DataLoader ``worker_init_fn``: stop glibc from returning freed batch memory to the kernel.

    NOTE [worker malloc tuning]: a worker allocates and frees the same ~10-30 MB every
    batch (decoded samples, crops). By default glibc serves blocks over 128 KB with fresh
    mmaps and trims the heap top on free, so every batch page-faults its memory in again
    (expensive in VMs). Raising the mmap and trim thresholds in the worker keeps that
    memory in the heap for reuse. Only worker processes are changed; no-op off glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: its maximum, 32 MiB
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: keep up to 1 GiB of freed heap
    except (OSError, AttributeError):
        pass


# Cache counters every batch reports back, so that reads made in worker processes count.
HIT_COUNTERS = ("l2_hits", "l1_hits", "source_reads")


def _hit_counts(cache) -> list[int]:
    if cache is None:
        return [0] * len(HIT_COUNTERS)
    stats = cache.stats()
    return [stats[k] for k in HIT_COUNTERS]


class _BatchDataset(torch.utils.data.Dataset):
    """Adapts a CachedImageFolder to batch requests: fetch once per batch, transform as a batch."""

    def __init__(self, folder: CachedImageFolder, transform, recycle: bool = False) -> None:
        self.folder, self.transform = folder, transform
        self.pool = SharedBatchPool(recycle)  # per worker after fork / spawn

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, index):
        return self.__getitems__(BatchRequest([index]))

    def __getitems__(self, request: BatchRequest):
        size = request.size if isinstance(request, BatchRequest) else self.transform.size
        seed = request.seed if isinstance(request, BatchRequest) else None
        before = _hit_counts(getattr(self.folder, "cache", None))
        t0 = time.perf_counter()
        samples, targets, skipped = self.folder.load_many(request, copy=False)  # crops copy anyway
        read_ahead = getattr(self.folder, "read_ahead", None)  # a CachedImageFolder's (not a plain folder's)
        if read_ahead is not None and getattr(request, "ahead", None):
            read_ahead(request.ahead)  # NOTE [loader read-ahead]
        waited = time.perf_counter() - t0
        after = _hit_counts(getattr(self.folder, "cache", None))
        hits = [a - b for a, b in zip(after, before)]
        images = self.transform.batch(samples, random.Random(seed), size,
                                      out=self.pool.batch((len(samples), 3, size, size), self.transform.torch_dtype,
                                                          self.transform.channels_last))
        worker = torch.utils.data.get_worker_info()
        made = (worker.id if worker else -1, self.pool.allocations)
        # small results travel pickled, not as tensors: each tensor would be a shared-memory segment
        # of its own, created, passed and mapped again for every batch
        return images, np.asarray(targets, dtype=np.int64), list(skipped), waited, hits, made


def _passthrough(batch):
    return batch


class CachedDataLoader(SamplerControls):
    """Iterates ``(images, labels)`` batches of one rank; made by ``cached_dataloader``.

    Attributes:
        dataset: the ``CachedImageFolder``.
        sampler: the ``ShardedBatchSampler`` (epoch, size, rank, resume position).
        loader: the underlying ``torch.utils.data.DataLoader``.
        skipped: indices of bad samples skipped and replaced so far (``on_error="skip"``;
            NOTE [replacing bad samples] in ``loaders.replacement``).
        cache_wait_s: seconds workers spent waiting on the cache, summed over batches.
        cache_hits: ``{"l2_hits", "l1_hits", "source_reads"}`` of the batches yielded so far,
            counted where the reads happen (in the workers when ``workers > 0``).
        shared_allocations: per worker id, the shared-memory batch buffers it has allocated
            (constant in steady state: NOTE [recycled shared batches]).
        feed: the ``DeviceFeed`` with ``device`` given (its ``ring`` counts allocations and waits).
    """

    def __init__(self, dataset: CachedImageFolder, transform, sampler: ShardedBatchSampler, *, workers: int,
                 prefetch_factor: int, device: torch.device | None = None, multiprocessing_context=None) -> None:
        self.dataset, self.sampler = dataset, sampler
        self.feed = None
        if device is not None:  # NOTE [uint8 to the device]: workers make raw channels-last uint8
            self.feed = DeviceFeed(device, transform.torch_dtype, transform.channels_last, mean=transform.mean,
                                   std=transform.std, slots=prefetch_factor + 2)
            transform = dataclasses.replace(transform, normalize=False, dtype="uint8", channels_last=True)
        self.transform = transform
        kwargs = {}
        if workers > 0:
            detect_in_next()  # NOTE [restarting dead workers]
            kwargs = dict(prefetch_factor=prefetch_factor, persistent_workers=True,
                          multiprocessing_context=multiprocessing_context, worker_init_fn=_keep_freed_memory)
        # NOTE [recycled shared batches] (loaders.shared_batches): every batch goes back to its worker,
        # once copied to the device, once the user drops it (NOTE [handing out shared batches]) or once
        # DALI has read it (NOTE [DALI CPU source])
        sampler.read_ahead = max(1, workers)  # NOTE [loader read-ahead]
        batches = _BatchDataset(dataset, transform, recycle=workers > 0)
        self.loader = torch.utils.data.DataLoader(batches, batch_sampler=sampler, num_workers=workers,
                                                  collate_fn=_passthrough, pin_memory=False, **kwargs)
        self.handed_out = HandedOut(limit=batches.pool.keep * max(1, workers))
        self.skipped: list[int] = []
        self.cache_wait_s = 0.0
        self.cache_hits = dict.fromkeys(HIT_COUNTERS, 0)
        self.shared_allocations: dict[int, int] = {}  # worker id -> shared buffers it allocated so far
        self.batches_done = 0

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return len(self.sampler)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(images NCHW, labels int64)`` for the rest of the current epoch (on ``device``)."""
        if self.feed is not None:
            for images, labels in self.transported():
                out = self.feed(images)
                self.give_back(images)
                yield out, labels.to(self.feed.device, non_blocking=True)
            return
        for images, labels in self.transported():
            self.handed_out.collect()
            self.handed_out.track(images)
            yield images, labels

    def transported(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(images, labels)`` of the rest of the epoch as the workers made them, counters updated.

        Hand each batch to ``give_back`` once its pixels are read, so that its worker can
        reuse the buffer (NOTE [recycled shared batches]); the normaliser reads them at once,
        DALI a few batches later (NOTE [DALI CPU source]).
        """
        if self.loader.num_workers and self.loader._iterator is None:  # workers are forked now
            # NOTE [collect before fork]: garbage this process has not collected yet (a
            # reference cycle) is copied into every forked worker, and the first collection
            # there runs its finalizers in a process without the threads they may wait for. A
            # DALI pipeline dropped here hung a worker forever that way (Executor2's destructor
            # in pthread_cond_destroy; seen in the test suite), or crashed it (SIGSEGV, when
            # the worker collects at once). Collecting first runs those finalizers here, where
            # their threads live.
            gc.collect()
        self.batches_done = self.sampler.start
        restarts = 0
        while True:
            try:
                for images, labels, skipped, waited, hits, (worker, made) in self.loader:
                    self.batches_done += 1
                    self.cache_wait_s += waited
                    for name, n in zip(HIT_COUNTERS, hits):
                        self.cache_hits[name] += n
                    self.skipped.extend(skipped)
                    self.shared_allocations[worker] = made
                    yield images, torch.from_numpy(labels)
                    del images
                return
            except (RuntimeError, OSError, EOFError) as exc:  # NOTE [restarting dead workers]
                if not is_dead_worker(exc, self.loader) or restarts == MAX_RESTARTS:
                    raise
                restarts += 1
                shut_down(self.loader, exc, restarts)
                self.handed_out.clear()
                self.sampler.start = self.batches_done

    def give_back(self, images: torch.Tensor) -> None:
        """Let the worker that made ``images`` (from ``transported``) reuse its buffer: the pixels were read."""
        release(images)
        self.handed_out.keep_mapped(images)

    def close(self) -> None:
        """Stop the workers and close the dataset's cache connections."""
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader._iterator = None
        self.dataset.close()


def cached_dataloader(root: str | os.PathLike, *, batch_size: int, train: bool, size: int = 224,
                      workers: int = 2, cache_dir=None, redis=None, l2=None, distributed=None, seed: int = 0,
                      drop_last: bool | None = None, cache=None, on_error: str = "raise", cache_size: int = 256,
                      prefetch_factor: int = 2, dtype: str = "float32", normalize: bool = True,
                      channels_last: bool = False, device=None,
                      multiprocessing_context=None, locality: str = "global", local_size: int | None = None,
                      exchange_fraction: float = DEFAULT_EXCHANGE_FRACTION,
                      follow_external_links: bool = False) -> CachedDataLoader:
    """A DataLoader over the two-level cache yielding ``(images NCHW, labels int64)``.

    Training shuffles every epoch (``set_epoch``) with random-resized-crop + flip; validation
    keeps the dataset order with resize + center crop. Each rank sees its shard (see NOTE
    [sharding and the last batch] in ``loaders.sampler``); with ``locality="node"`` the
    ranks of a node draw the samples held by their node's Redis (NOTE [node-local order]
    in ``loaders.locality``; with ``l2=["shm://"]`` that partition is the node's own memory,
    read in place, NOTE [shm store]). Batches are fetched with one round
    trip per Redis shard and transformed in the workers (NOTE [batch requests carry the
    epoch state]), which stay alive across epochs.

    Args:
        root: ImageFolder root.
        batch_size: samples per batch on this rank.
        train: training (shuffle, random crops) or validation pipeline.
        size: crop side (default 224); change it later with ``set_size``.
        workers: DataLoader worker processes (default 2; 0 loads in the main process).
        cache_dir: L1 directory (required unless ``cache`` is given or False).
        l2: where L2 lives: None = embedded server in ``cache_dir``, a list of URLs
            (``["shm://"]``: this node's memory, zero-copy; Redis shards), False = no L2.
        redis: ``l2``'s old name, still taken.
        distributed: None (use torch.distributed when initialised), False, or (rank, world_size).
        seed: shuffling and augmentation seed; must be equal on every rank.
        drop_last: default True for training and False for validation.
        cache: None (build a cache from ``cache_dir``, ``l2``, ``cache_size``), a
            ``cachepipe.CacheConfig`` of ``root`` (all cache settings in one object), a
            ``TwoLevelCache`` to share, or False (decode files).
        on_error: "raise" or "skip" bad samples: replaced by others so every batch stays
            full (NOTE [replacing bad samples]; counted in ``loader.skipped``).
        cache_size: shorter side of cached samples (default 256).
        prefetch_factor: batches prefetched per worker (default 2).
        dtype: "float32" (default), "float16", "bfloat16" (normalised), or "uint8" with
            ``normalize=False`` (raw pixels).
        normalize: ImageNet mean/std normalisation (default True).
        channels_last: NHWC memory layout (shape stays NCHW).
        device: where batches are delivered and normalised. None (default): on the CPU, made
            whole by the workers and handed over without a copy (NOTE [handing out shared
            batches]); ``"cuda"`` (or ``"cuda:N"``): workers ship uint8, the loader copies it
            through its ring of pinned slots on a side stream and normalises on the GPU into
            ``dtype`` (NOTE [uint8 to the device]); labels arrive there too.
        multiprocessing_context: e.g. "spawn"; default: torch's.
        locality: ``"global"`` (default): shuffle over the whole dataset; ``"node"``: the
            ranks of a node draw the samples whose L2 shard is on their node (``l2`` lists
            one Redis URL per node in node order, or is ``["shm://"]`` on every node; ranks
            are node-major). Several nodes with ``shm://`` need ``"node"``.
        local_size: ranks per node (default: ``LOCAL_WORLD_SIZE``, else all ranks on one node).
        exchange_fraction: with ``locality="node"``, the share of samples dealt across
            nodes each epoch, in [0, 1] (default 0.02: NOTE [default exchange fraction]).

    Returns:
        A ``CachedDataLoader`` (``len``, iteration, ``set_epoch``, ``set_size``,
        ``state_dict``, ``load_state_dict``, ``close``).

    Raises:
        ValueError: bad arguments (an unknown ``dtype``, ``device="cuda"`` without CUDA, ...),
            an empty dataset, or too few samples for one batch.
        cachepipe.l2.placement.LocalityError: ``locality="node"`` with a store that cannot
            tell where samples are (the message says why).

    Example:
        >>> loader = cached_dataloader("/data/train", batch_size=256, train=True, size=224,
        ...                            workers=8, cache_dir="/local/cache")  # doctest: +SKIP
        >>> loader = cached_dataloader("/data/train", batch_size=256, train=True, cache_dir="/local/cache",
        ...                            l2=["redis://node0:6379/0", "redis://node1:6379/0"],
        ...                            distributed=(rank, 16), local_size=8, locality="node")  # doctest: +SKIP
        >>> local = cached_dataloader("/data/train", batch_size=256, train=True, cache_dir="/local/cache",
        ...                           l2=["shm://"], distributed=(rank, 16), local_size=8,
        ...                           locality="node")  # doctest: +SKIP
        >>> gpu = cached_dataloader("/data/train", batch_size=128, train=True, cache_dir="/local/cache",
        ...                         dtype="bfloat16", channels_last=True, device="cuda")  # doctest: +SKIP
        >>> for epoch in range(epochs):  # doctest: +SKIP
        ...     loader.set_epoch(epoch)
        ...     for images, labels in loader: ...
    """
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    device = resolve_device(device)
    check_locality(locality, exchange_fraction)
    rank, world = resolve_rank(distributed)
    transform = make_transform(train, size, dtype=dtype, normalize=normalize, channels_last=channels_last)
    dataset = CachedImageFolder(root, cache=cache, cache_dir=cache_dir, redis=redis, l2=l2, cache_size=cache_size,
                                on_error=on_error, follow_external_links=follow_external_links)
    drop_last = train if drop_last is None else bool(drop_last)
    placed = node_locality(dataset, locality=locality, exchange_fraction=exchange_fraction, local_size=local_size,
                           rank=rank, world_size=world, train=train)
    sampler = ShardedBatchSampler(len(dataset), batch_size, shuffle=train, seed=seed, rank=rank,
                                  world_size=world, drop_last=drop_last, size=size, locality=placed)
    return CachedDataLoader(dataset, transform, sampler, workers=workers, device=device,
                            prefetch_factor=prefetch_factor, multiprocessing_context=multiprocessing_context)
