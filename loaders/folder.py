"""``CachedImageFolder``: torchvision's ``ImageFolder`` reading decoded samples from the two-level cache."""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch.utils.data

from cachepipe import CorruptSampleError, Manifest, TwoLevelCache, decode_and_resize

__all__ = ["CachedImageFolder", "ON_ERROR"]

ON_ERROR = ("raise", "skip")


class CachedImageFolder(torch.utils.data.Dataset):
    """A drop-in for ``torchvision.datasets.ImageFolder`` served from the cachepipe cache.

    Classes, ``class_to_idx``, ``samples`` (absolute paths), ``targets`` and their order
    follow torchvision's rules (sorted class folders, files by sorted ``os.walk``, image
    extensions case-insensitive). A sample is the cached uint8 ``(H, W, 3)`` numpy array
    whose shorter side is ``cache_size`` (torchvision gives a PIL image); use
    ``loaders.transforms`` on it, or any callable taking that array.

    ``__getitems__(indices)`` fetches a whole batch with one round trip per Redis shard;
    torch's DataLoader calls it with each batch's index list and passes the returned list of
    ``(sample, target)`` pairs to its ``collate_fn``. Cache connections open lazily in each
    process, so the dataset is safe in DataLoader workers (fork or spawn).

    Args:
        root: ImageFolder root (``<root>/<class>/**/<image>``).
        transform: applied to each sample (uint8 HWC numpy array).
        target_transform: applied to each label.
        cache: ``None`` builds a ``TwoLevelCache`` for ``root``; a ``TwoLevelCache`` to
            share one; ``False`` reads and decodes the files every time (no cache, same
            ``decode_and_resize`` pixels).
        cache_dir: L1 directory when ``cache`` is None (required then).
        redis: L2 shards: ``None`` embedded server in ``cache_dir``, a list of URLs, or
            ``False`` for no L2.
        cache_size: shorter side of cached samples in pixels (default 256).
        on_error: ``"raise"`` (default): a corrupt file raises ``CorruptSampleError``
            naming it; ``"skip"``: it is left out of its batch, warned about and counted
            in ``skipped`` (``__getitem__`` still raises: one sample cannot be skipped).

    Raises:
        ValueError: an empty root or class folder (the message lists what was found), a
            bad ``on_error``, or a ``cache`` built for another root.
        FileNotFoundError: ``root`` does not exist.

    Example:
        >>> ds = CachedImageFolder("/data/train", cache_dir="/local/cache")  # doctest: +SKIP
        >>> img, label = ds[0]  # doctest: +SKIP
    """

    def __init__(self, root: str | os.PathLike, transform: Callable | None = None,
                 target_transform: Callable | None = None, *, cache=None, cache_dir=None, redis=None,
                 cache_size: int = 256, on_error: str = "raise", follow_external_links: bool = False) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"unknown on_error {on_error!r}; valid: {list(ON_ERROR)}")
        self._owns_cache = cache is None
        if cache is None:
            if cache_dir is None:
                raise ValueError("pass cache_dir (the local L1 directory), a TwoLevelCache as cache=, "
                                 "or cache=False to read the files directly")
            cache = TwoLevelCache(os.fspath(root), os.fspath(cache_dir), redis=redis, cache_size=cache_size,
                                  follow_external_links=follow_external_links)
        if cache is False:
            self.cache = None
            self.manifest = Manifest.scan(root, follow_external_links=follow_external_links)
            self.cache_size = int(cache_size)
        else:
            self.cache = cache
            self.manifest = cache.manifest
            self.cache_size = int(cache.config.cache_size)
            if os.path.abspath(os.fspath(root)) != self.manifest.root:
                raise ValueError(f"the cache given serves {self.manifest.root!r}, not {os.path.abspath(root)!r}")
        self.root = self.manifest.root
        self.transform, self.target_transform = transform, target_transform
        self.on_error = on_error
        self.classes = list(self.manifest.classes)
        self.class_to_idx = dict(self.manifest.class_to_idx)
        self.samples = [(os.path.join(self.root, rel), int(label)) for rel, label in self.manifest.samples]
        self.imgs = self.samples  # torchvision's alias
        self.targets = [label for _, label in self.samples]
        self.skipped: list[int] = []  # indices left out (on_error="skip"), in this process

    def __len__(self) -> int:
        return len(self.samples)

    def __repr__(self) -> str:
        source = "files" if self.cache is None else type(self.cache).__name__
        return (f"CachedImageFolder(root={self.root!r}, samples={len(self)}, classes={len(self.classes)}, "
                f"cache_size={self.cache_size}, source={source})")

    # ---- raw samples ------------------------------------------------------------------
    def _read_file(self, index: int) -> np.ndarray:
        path = self.samples[index][0]
        with open(path, "rb") as f:
            data = f.read()
        return decode_and_resize(data, self.cache_size, index=index, path=self.manifest.samples[index][0])

    def load(self, index: int) -> np.ndarray:
        """The untransformed uint8 HWC sample ``index``.

        Raises:
            CorruptSampleError: the file cannot be decoded (names it).
            IndexError: index out of range.
        """
        if not -len(self) <= index < len(self):
            raise IndexError(f"sample index {index} out of range for {len(self)} samples")
        index = index % len(self)
        return self._read_file(index) if self.cache is None else self.cache.get(index)

    def load_many(self, indices: Sequence[int], *,
                  copy: bool = True) -> tuple[list[np.ndarray], list[int], list[int]]:
        """Untransformed samples of a batch: ``(samples, targets, skipped_indices)``.

        One round trip (an MGET) per Redis shard. With ``on_error="skip"`` corrupt samples
        are left out (and returned in ``skipped_indices``); otherwise they raise.
        ``copy=False`` returns cached samples as read-only views of the Redis reply (for
        callers that crop them anyway).
        """
        indices = [int(i) for i in indices]
        skip = self.on_error == "skip"
        if self.cache is None:
            arrays = []
            for i in indices:
                try:
                    arrays.append(self._read_file(i))
                except CorruptSampleError:
                    if not skip:
                        raise
                    arrays.append(None)
        else:
            arrays = self.cache.get_many(indices, errors="skip" if skip else "raise", copy=copy)
        samples, targets, skipped = [], [], []
        for i, arr in zip(indices, arrays):
            if arr is None:
                skipped.append(i)
                continue
            samples.append(arr)
            targets.append(self.targets[i])
        if skipped:
            self.skipped.extend(skipped)
            names = ", ".join(self.samples[i][0] for i in skipped[:3]) + (", ..." if len(skipped) > 3 else "")
            warnings.warn(f"skipped {len(skipped)} corrupt sample(s) (on_error='skip'): {names}",
                          RuntimeWarning, stacklevel=2)
        return samples, targets, skipped

    # ---- torchvision Dataset protocol -------------------------------------------------
    def _apply(self, sample, target):
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __getitem__(self, index: int):
        """``(transform(sample), target_transform(target))`` for one index."""
        return self._apply(self.load(index), self.targets[index % len(self)])

    def __getitems__(self, indices: Sequence[int]) -> list:
        """A batch as a list of ``(sample, target)`` pairs, fetched in one round trip per shard.

        With ``on_error="skip"`` the list is shorter by the corrupt samples.
        """
        samples, targets, _ = self.load_many(indices)
        return [self._apply(s, t) for s, t in zip(samples, targets)]

    def close(self) -> None:
        """Close this process's cache handles when this dataset opened the cache (a shared
        ``cache=`` stays open; the embedded Redis server keeps running for other processes)."""
        if self.cache is not None and self._owns_cache:
            self.cache.close()
