"""Data loaders for training, by name: ``torch`` (cached DataLoader), ``dali``, ``memory``.

Every loader yields ``(images float NCHW, labels int64)`` and has ``len()``,
``set_epoch(e)``, ``set_size(s)``, ``state_dict()`` / ``load_state_dict()`` (mid-epoch
position), so the training loop does not care which one it drives.

- ``torch``: ``loaders.cached_dataloader`` reading from the two-level cache (L2 Redis, L1 LMDB).
- ``dali``: ``loaders.build_dali_loader`` fed from the same cache (GPU or DALI CPU mode).
- ``memory``: decodes the split once into RAM, no cache (tests, reference runs).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from loaders.folder import ON_ERROR
from trainer.data.layout import check_data_root
from trainer.data.memory import MemoryLoader, SyntheticLoader, load_split

__all__ = ["LOADERS", "ON_ERROR", "LoaderSpec", "make_loader", "check_data_root", "loader_workers", "MemoryLoader",
           "SyntheticLoader"]

LOADERS = ("torch", "dali", "memory")


@dataclass(frozen=True, kw_only=True)
class LoaderSpec:
    """Where and how one rank reads its data (everything but the phase); keywords only.

    Args:
        kind: ``torch``, ``dali`` or ``memory``.
        root: data root with ``train/`` and ``val/``.
        rank, world_size: this rank's shard.
        seed: shuffling and augmentation seed (equal on every rank).
        cache: the cache settings (a ``cachepipe.CacheConfig`` resolved at the entry point);
            each split's loader opens it for ``root/<split>`` at the phase's cache size.
            Required by ``torch`` and ``dali``; unused by ``memory``.
        cache_size: shorter side of cached samples when the phase names none.
        workers: loader worker processes.
        device: where batches go (``cpu``, ``cuda`` or ``cuda:N``).
        locality, exchange_fraction, local_size: node-local sampling (``loaders.locality``).
        on_error: ``skip`` or ``raise`` a bad sample.
    """

    kind: str
    root: str
    rank: int = 0
    world_size: int = 1
    seed: int = 0
    cache: object | None = None
    cache_size: int = 256
    workers: int = 0
    device: str = "cpu"
    locality: str = "global"
    exchange_fraction: float = 0.0
    local_size: int = 1
    on_error: str = "skip"

    def __post_init__(self):
        if self.kind not in LOADERS:
            raise ValueError(f"unknown loader {self.kind!r}; valid: {list(LOADERS)}")
        if self.kind != "memory" and self.cache is None:
            raise ValueError(f"loader {self.kind!r} reads through the cache: pass cache= (a cachepipe.CacheConfig)")


def loader_workers(recipe_workers: int, ranks_here: int) -> int:
    """Loader worker processes per rank: the cores this process may use divided among the
    ``ranks_here`` ranks on this machine, at least 1, at most the recipe's value (0 stays 0:
    load in the training process).

    More workers than cores only adds contention (and torch warns, once per loader, that it
    "will create N worker processes").
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(int(recipe_workers), max(1, cores // max(1, int(ranks_here))))


_DECODED: dict = {}


def make_loader(spec: LoaderSpec, *, train: bool, batch_size: int, size: int, cache_size: int | None = None):
    """Build ``spec.kind``'s loader for the train or val split at ``size`` px, reading samples
    cached at ``cache_size`` (default ``spec.cache_size``; NOTE [cache size per phase]).

    Raises:
        ValueError: when the chosen loader's package is missing (names the alternative).
    """
    cache_size = cache_size or spec.cache_size
    if spec.kind == "memory":
        split = "train" if train else "val"
        key = (spec.root, split, cache_size)
        if key not in _DECODED:
            _DECODED[key] = load_split(spec.root, split, cache_size)[:2]
        images, labels = _DECODED[key]
        return MemoryLoader(images, labels, batch_size=batch_size, train=train, size=size,
                            rank=spec.rank, world_size=spec.world_size, seed=spec.seed)
    import loaders

    # NOTE [loader contract]: the cached loaders shard by (rank, world_size) themselves and
    # give every rank the same number of batches (loaders.sampler); they read the split
    # folder root/train or root/val through the cache spec.cache describes.
    split = str(Path(spec.root) / ("train" if train else "val"))
    cache = dataclasses.replace(spec.cache, source=split, cache_size=cache_size)
    on_gpu = spec.device.startswith("cuda")
    if spec.kind == "torch":  # on a GPU: uint8 to the device, normalised there (NOTE [uint8 to the device])
        return loaders.cached_dataloader(split, batch_size=batch_size, train=train, size=size, workers=spec.workers,
                                         cache=cache, distributed=(spec.rank, spec.world_size), seed=spec.seed,
                                         on_error=spec.on_error, channels_last=on_gpu,
                                         device=spec.device if on_gpu else None,
                                         locality=spec.locality, local_size=spec.local_size,
                                         exchange_fraction=spec.exchange_fraction)
    if not loaders.dali_available():
        raise ValueError("--loader dali needs nvidia-dali: pip install 'cachepipe[dali]' (or use --loader torch)")
    return loaders.build_dali_loader(split, batch_size=batch_size, train=train, size=size,
                                     device="gpu" if on_gpu else "cpu", shard_id=spec.rank,
                                     num_shards=spec.world_size, seed=spec.seed, cache=cache,
                                     workers=max(spec.workers, 1), on_error=spec.on_error,
                                     device_id=int(spec.device.split(":")[1]) if ":" in spec.device else None,
                                     locality=spec.locality, local_size=spec.local_size,
                                     exchange_fraction=spec.exchange_fraction)
