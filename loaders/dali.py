"""``build_dali_loader``: a DALI pipeline fed from the cache through ``external_source``.

NOTE [DALI crop parameters]: crop windows and flips are drawn in Python by the same
torchvision rule and the same per-batch seed as the torch path (``TrainTransform.plan``),
then applied by DALI operators: ``fn.resize`` with a pixel ROI does the resized crop
(antialiased bilinear, on the GPU with ``device="gpu"``) and ``fn.crop_mirror_normalize``
flips, normalises and transposes to CHW. So both paths sample identical crops for the same
seed, and the output size is a per-batch tensor argument: ``set_size`` changes it between
epochs without rebuilding the pipeline (``fn.random_resized_crop``'s ``size`` is not a
tensor argument in DALI 2.4, and its fallback differs from torchvision's).

NOTE [DALI CPU resize]: DALI 2.4's CPU resampling costs about ten times torch's
vectorised uint8 kernel (NOTE [fast resized crop] in ``loaders.transforms``; figures in
``docs/benchmarks/history/decisions.md``, "Measurements behind design decisions"), and on a CPU-only
machine that one operator would cost more than decoding the JPEG saves. So by
default (``dali_resize=None``) the resized crop runs in DALI only on the GPU; in CPU mode
it runs in torch before DALI, which normalises and lays out the batch (NOTE [DALI CPU
source] in ``loaders.dali_sources``). The windows, flips and output are the same either way; ``dali_resize=True``
keeps DALI's CPU resize (the GPU graph, e.g. to test it on a CPU).

NOTE [DALI after an error]: an exception out of the pipeline (a corrupt sample with
``on_error="raise"``, an error of the cache) leaves DALI 2.4's iterator in a state where the
next pass ends at once, silently empty. So the loader drops a pipeline that failed and
builds a new one for the next pass, which then starts the epoch set, from its first batch
(or the resume position), as the torch path does.

NOTE [DALI epochs]: the source snapshots epoch, size and resume position when an epoch's
first batch is requested, which happens when ``__iter__`` resets DALI, after any
``set_epoch``/``set_size``. Sharding and the last batch follow NOTE [sharding and the last
batch] (``loaders.sampler``): every rank gets the same number of batches, and with
``drop_last=False`` the final partial batch is returned as a smaller batch
(``LastBatchPolicy.PARTIAL``). Leaving an epoch early drains the at most
``prefetch_queue_depth`` batches DALI already scheduled.
"""
from __future__ import annotations

import functools
import os

import torch

from loaders._optional import require_dali
from loaders.dali_sources import CacheSource, CropSource
from loaders.dataloader import CachedDataLoader, resolve_rank
from loaders.folder import CachedImageFolder
from loaders.locality import DEFAULT_EXCHANGE_FRACTION, check_locality, node_locality
from loaders.sampler import SamplerControls, ShardedBatchSampler
from loaders.transforms import IMAGENET_MEAN, IMAGENET_STD, make_transform

__all__ = ["DALILoader", "build_dali_loader"]

_OUT_DTYPES = ("float32", "float16", "uint8")


def _pipeline(source, device: str, out_dtype: str, mean, std):
    from nvidia.dali import fn, types

    if out_dtype == "uint8":  # raw pixels: normalise on the GPU later (loaders.transforms.normalize)
        mean, std = (0.0, 0.0, 0.0), (1 / 255.0,) * 3
    normalize = dict(mean=[m * 255.0 for m in mean], std=[s * 255.0 for s in std], output_layout="CHW",
                     dtype={"float16": types.FLOAT16, "uint8": types.UINT8}.get(out_dtype, types.FLOAT))
    if isinstance(source, CropSource):  # NOTE [DALI CPU source]: crops come resized and flipped
        images, labels = fn.external_source(source=source, num_outputs=2, batch=True, cycle="raise", no_copy=True,
                                            layout=["HWC", ""], dtype=[types.UINT8, types.INT64])
        return fn.crop_mirror_normalize(images.gpu() if device == "gpu" else images, **normalize), labels
    images, labels, start, end, size, mirror, crop, crop_pos = fn.external_source(
        source=source, num_outputs=8, batch=True, cycle="raise", layout=["HWC", "", "", "", "", "", "", ""],
        dtype=[types.UINT8, types.INT64, types.FLOAT, types.FLOAT, types.FLOAT, types.INT32, types.FLOAT,
               types.FLOAT])
    if device == "gpu":
        images = images.gpu()
    images = fn.resize(images, roi_start=start, roi_end=end, roi_relative=False, size=size,
                       antialias=True, interp_type=types.INTERP_LINEAR, dtype=types.UINT8)
    images = fn.crop_mirror_normalize(images, crop=crop, crop_pos_y=crop_pos[0], crop_pos_x=crop_pos[1],
                                      mirror=mirror, **normalize)
    return images, labels


def _build_iterator(source, device: str, out_dtype: str, batch_size: int, **pipeline_args):
    """A built pipeline over ``source`` and DALI's PyTorch iterator on it."""
    from nvidia.dali import pipeline_def
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    pipe = pipeline_def(_pipeline, batch_size=batch_size, **pipeline_args)(source, device, out_dtype, IMAGENET_MEAN,
                                                                           IMAGENET_STD)
    pipe.build()
    return pipe, DALIGenericIterator(pipe, ["images", "labels"], last_batch_policy=LastBatchPolicy.PARTIAL,
                                     auto_reset=False, prepare_first_batch=False)


class DALILoader(SamplerControls):
    """Iterates ``(images NCHW, labels int64)`` from a DALI pipeline; made by ``build_dali_loader``.

    Same interface as ``CachedDataLoader``: ``len``, iteration, ``set_epoch``, ``set_size``,
    ``state_dict``, ``load_state_dict``, ``close``; ``skipped``, ``cache_wait_s`` and
    ``cache_hits`` too.
    """

    def __init__(self, folder: CachedImageFolder, sampler: ShardedBatchSampler, train: bool, *,
                 device: str, device_id, workers: int, out_dtype: str, prefetch_queue_depth: int, seed: int,
                 dali_resize: bool) -> None:
        self.dataset, self.sampler = folder, sampler
        if dali_resize:
            self.source = self._counted = CacheSource(folder, sampler, train)
        else:  # NOTE [DALI CPU source]: the workers report their reads with each batch
            crop = make_transform(train, sampler.size, dtype="uint8", normalize=False, channels_last=True)
            self._counted = CachedDataLoader(folder, crop, sampler, workers=workers, prefetch_factor=2)
            self.source = CropSource(self._counted, prefetch_queue_depth)
        self._build = functools.partial(_build_iterator, self.source, device, out_dtype, sampler.batch_size,
                                        num_threads=max(1, workers), device_id=device_id, seed=seed,
                                        prefetch_queue_depth=prefetch_queue_depth)
        self.pipe, self._iter = self._build()
        self._started = self._running = self._failed = False
        self.batches_done = 0

    @property
    def skipped(self) -> list[int]:
        """Indices of bad samples skipped and replaced so far (``on_error="skip"``)."""
        return self._counted.skipped

    @property
    def cache_wait_s(self) -> float:
        """Seconds the source (or its workers) spent waiting on the cache."""
        return self._counted.cache_wait_s

    @property
    def cache_hits(self) -> dict[str, int]:
        """``{"l2_hits", "l1_hits", "source_reads"}`` of the reads made for this loader."""
        return self._counted.cache_hits

    def __len__(self) -> int:
        return len(self.sampler)

    def _finish_epoch(self) -> None:
        """Drain what DALI already scheduled when the previous pass stopped early; after a pass
        that failed, replace the pipeline (NOTE [DALI after an error])."""
        if self._failed:
            del self._iter, self.pipe
            self.pipe, self._iter = self._build()
            self._started = self._running = self._failed = False
        elif self._running:
            self.source.abort = True
            for _ in self._iter:
                pass
            self._running = False

    def __iter__(self):
        """Yield ``(images NCHW, labels int64)`` for the rest of the current epoch (images on the
        GPU with ``device="gpu"``, labels on the CPU)."""
        self._finish_epoch()
        self.batches_done = self.sampler.start
        if self.batches_done >= len(self.sampler):  # resumed at the very end of an epoch
            self.sampler.start = 0
            return
        if self._started:
            self._iter.reset()  # calls iter(source): the new epoch state is read from here on
        self._started = True
        self._running = True
        try:
            for out in self._iter:
                self.batches_done += 1
                yield out[0]["images"], out[0]["labels"].view(-1)
        except Exception:
            self._failed = True
            raise
        self._running = False

    def load_state_dict(self, state: dict) -> None:
        self._finish_epoch()  # DALI may still hold batches of the pass that stopped early
        super().load_state_dict(state)

    def close(self) -> None:
        if not self._failed:  # a failed pipeline is dropped as it is
            self._finish_epoch()
        del self._iter, self.pipe
        self.source.close()


def build_dali_loader(root: str | os.PathLike, *, batch_size: int, train: bool, size: int = 224,
                      device: str = "gpu", shard_id: int | None = None, num_shards: int | None = None,
                      seed: int = 0, cache_dir=None, redis=None, l2=None, workers: int = 2, cache=None,
                      on_error: str = "raise", cache_size: int = 256, drop_last: bool | None = None,
                      dtype: str = "float32", device_id: int | None = None,
                      prefetch_queue_depth: int = 2, dali_resize: bool | None = None, locality: str = "global",
                      local_size: int | None = None,
                      exchange_fraction: float = DEFAULT_EXCHANGE_FRACTION,
                      follow_external_links: bool = False) -> DALILoader:
    """A DALI loader over the two-level cache yielding ``(images NCHW, labels int64)``, like ``cached_dataloader``.

    Each batch is fetched with ``get_many`` (one MGET per Redis shard) inside
    ``fn.external_source``; the resized crop, flip, normalisation and HWC->CHW run as DALI
    operators, on the GPU when ``device="gpu"`` (see NOTE [DALI crop parameters]); in CPU
    mode worker processes read and crop in torch, and DALI normalises (NOTE [DALI CPU resize],
    NOTE [DALI CPU source] in ``loaders.dali_sources``).

    Args:
        root: ImageFolder root.
        batch_size: samples per batch on this shard.
        train: random-resized-crop + flip with per-epoch shuffling, or resize + center crop.
        size: crop side (default 224); ``set_size`` changes it between epochs.
        device: "gpu" (default) or "cpu" (DALI CPU mode, ``device_id=None``).
        shard_id, num_shards: this rank and the world size; default: torch.distributed's
            when initialised, else 0 and 1.
        seed: shuffling, augmentation and DALI seed; equal on every rank.
        cache_dir, l2 (or redis), cache, on_error, cache_size: as ``CachedImageFolder``.
        workers: DALI CPU threads, and in CPU mode the source's worker processes that read
            and crop (default 2; 0: read and crop in this process).
        drop_last: default True for training, False for validation.
        dtype: "float32" (default), "float16", or "uint8" (not normalised: move to the GPU,
            then ``loaders.transforms.normalize``).
        device_id: CUDA device (default: the current one) for device="gpu".
        prefetch_queue_depth: batches DALI keeps in flight (default 2).
        dali_resize: resize with DALI's operator; default (``None``): on the GPU only, with
            torch's faster uint8 kernel in the source workers in CPU mode (NOTE [DALI CPU resize]).
        locality, local_size, exchange_fraction: node-local sampling, as ``cached_dataloader``.

    Raises:
        ImportError: DALI is not installed (names ``pip install 'cachepipe[dali]'``).
        ValueError: bad arguments, or an empty dataset.

    Example:
        >>> loader = build_dali_loader("/data/train", batch_size=256, train=True, size=224,
        ...                            device="gpu", cache_dir="/local/cache")  # doctest: +SKIP
        >>> for images, labels in loader: ...  # doctest: +SKIP
    """
    require_dali()
    check_locality(locality, exchange_fraction)
    if device not in ("gpu", "cpu"):
        raise ValueError(f"unknown device {device!r}; valid: ['cpu', 'gpu']")
    if dtype not in _OUT_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {list(_OUT_DTYPES)}")
    if (shard_id is None) != (num_shards is None):
        raise ValueError("pass both shard_id and num_shards, or neither")
    rank, world = resolve_rank(None if shard_id is None else (shard_id, num_shards))
    if device == "gpu":
        if not torch.cuda.is_available():
            raise ValueError("device='gpu' needs CUDA; pass device='cpu' for DALI CPU mode")
        device_id = torch.cuda.current_device() if device_id is None else device_id
    else:
        device_id = None
    folder = CachedImageFolder(root, cache=cache, cache_dir=cache_dir, redis=redis, l2=l2, cache_size=cache_size,
                               on_error=on_error, follow_external_links=follow_external_links)
    drop_last = train if drop_last is None else bool(drop_last)
    placed = node_locality(folder, locality=locality, exchange_fraction=exchange_fraction, local_size=local_size,
                           rank=rank, world_size=world, train=train)
    sampler = ShardedBatchSampler(len(folder), batch_size, shuffle=train, seed=seed, rank=rank, world_size=world,
                                  drop_last=drop_last, size=size, locality=placed)
    return DALILoader(folder, sampler, train, device=device, device_id=device_id, workers=workers,
                      out_dtype=dtype, prefetch_queue_depth=prefetch_queue_depth, seed=seed,
                      dali_resize=device == "gpu" if dali_resize is None else bool(dali_resize))
