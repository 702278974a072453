"""``CachedImageFolder``: torchvision's ``ImageFolder`` reading decoded samples from the two-level cache."""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch.utils.data
from PIL import Image

from cachepipe import CacheConfig, CorruptSampleError, Manifest, TwoLevelCache, decode_and_resize
from cachepipe.l2.spec import l2_setting
from cachepipe.source.reader import read_file
from cachepipe.source.scan import Walker
from cachepipe.source.views import Samples
from loaders._optional import torchvision_datasets
from loaders.replacement import fill_batch

__all__ = ["CachedImageFolder", "FileLoader", "ON_ERROR", "OUTPUTS"]

ON_ERROR = ("raise", "skip")
OUTPUTS = ("numpy", "pil")


def _base() -> type:
    """NOTE [torchvision base class]: where torchvision imports, ``CachedImageFolder`` is a
    ``torchvision.datasets.ImageFolder`` (so a ``VisionDataset``): torchvision's
    ``isinstance`` checks pass, and ``wrap_dataset_for_transforms_v2`` finds its wrapper,
    which it looks up by walking the class's bases for a registered dataset class (a bare
    ``VisionDataset`` subclass gets "No wrapper exists"). ImageFolder's ``__init__``, which
    scans the files itself, is not called: the attributes it sets are set here, from the
    manifest, and ``__getitem__``/``__len__`` are this class's. Without torchvision it is a
    torch ``Dataset`` with the same behaviour; ``loaders._optional`` decides which."""
    datasets = torchvision_datasets()
    return torch.utils.data.Dataset if datasets is None else datasets.ImageFolder


class FileLoader:
    """``CachedImageFolder.loader`` on the cache path: ``loader(path)`` reads and decodes one
    file as the cache holds it (``decode_and_resize`` to ``cache_size``), a PIL image for
    ``output="pil"``, else a uint8 array: what ``ds[i]`` gives before ``transform``, for
    torchvision code that calls ``ds.loader(path)`` itself. Picklable (workers).
    """

    def __init__(self, cache_size: int, output: str) -> None:
        self.cache_size, self.output = int(cache_size), output

    def __call__(self, path: str):
        sample = decode_and_resize(read_file(path), self.cache_size, path=path)
        return Image.fromarray(sample) if self.output == "pil" else sample

    def __repr__(self) -> str:
        return f"FileLoader(cache_size={self.cache_size}, output={self.output!r})"


class CachedImageFolder(_base()):
    """A drop-in for ``torchvision.datasets.ImageFolder`` served from the cachepipe cache
    (one, where torchvision is installed: NOTE [torchvision base class]).

    Classes, ``class_to_idx``, ``samples`` (absolute paths), ``targets`` and their order
    follow torchvision's rules (sequences built on demand from the manifest's arrays, NOTE
    [lazy sample lists]: a dataset of 1.28M files costs a rank and its workers megabytes) (sorted class folders, files by sorted ``os.walk``, image
    extensions case-insensitive), and so do ``extensions``, ``is_valid_file`` and
    ``allow_empty`` (NOTE [torchvision arguments]). A sample is the cached uint8
    ``(H, W, 3)`` numpy array whose shorter side is ``cache_size``; ``output="pil"`` gives
    it as a PIL image, so a torchvision transform pipeline runs unchanged.

    ``__getitems__(indices)`` fetches a whole batch with one round trip per Redis shard;
    torch's DataLoader calls it with each batch's index list and passes the returned list of
    ``(sample, target)`` pairs to its ``collate_fn``. Cache connections open lazily in each
    process, so the dataset is safe in DataLoader workers (fork, spawn or forkserver); it
    pickles with the path of its mapped manifest (NOTE [manifest pickles as its path]).

    Args:
        root: ImageFolder root (``<root>/<class>/**/<image>``).
        transform: applied to each sample (see ``output``).
        target_transform: applied to each label.
        loader: ``loader(path) -> sample`` as torchvision's; given, every sample is
            ``loader(path)`` of its file and the cache is not used (a warning says so
            unless ``cache=False``); ``output`` does not apply. ``ds.loader`` is it, else a
            :class:`FileLoader` giving the cache's pixels.
        is_valid_file: ``f(path) -> bool`` choosing the files (instead of ``extensions``).
        allow_empty: keep class folders without a valid file instead of raising.
        extensions: file endings to keep (default: torchvision's ``IMG_EXTENSIONS``),
            as ``DatasetFolder(extensions=)``; not together with ``is_valid_file``.
        cache: ``None`` builds a ``TwoLevelCache`` for ``root`` from ``cache_dir``,
            ``l2`` and ``cache_size``; a ``CacheConfig`` (``source`` = ``root``) opens
            the cache it describes, all settings in one object; a ``TwoLevelCache`` to share
            one; ``False`` reads and decodes the files every time (no cache, same
            ``decode_and_resize`` pixels).
        cache_dir: L1 directory when ``cache`` is None (required then).
        l2: where L2 lives (when ``cache`` is None): ``None`` the embedded server in
            ``cache_dir``, a list of URLs (``["shm://"]``: this node's memory; Redis
            shards), or ``False`` for no L2. ``redis``: its old name, still taken.
        cache_size: shorter side of cached samples in pixels (default 256; a given
            ``cache`` has its own).
        on_error: ``"raise"`` (default): a corrupt or unreadable file raises
            ``CorruptSampleError`` naming it (a custom ``loader``'s errors pass through,
            as torchvision's); ``"skip"``: in a batch (``load_many``, ``__getitems__``)
            it is warned about, counted in ``skipped`` and replaced by another sample, so
            the batch stays full (NOTE [replacing bad samples] in ``loaders.replacement``);
            ``__getitem__`` still raises.
        output: ``"numpy"`` (default: the fast path, no conversion per sample) or ``"pil"``
            (what torchvision's ImageFolder gives): what ``transform`` and ``ds[i]`` get.
            ``load``/``load_many`` (and so ``cached_dataloader``) always give arrays.
        follow_external_links: also follow symlinks leaving ``root`` (NOTE [symlinks in
            the source] in ``cachepipe.source.scan``).

    Raises:
        EmptyFolderError: (a ``FileNotFoundError``, as torchvision's, and a ``ValueError``)
            an empty root or a class folder without a valid file; the message begins with
            torchvision's ("Found no valid file for the classes ...": NOTE [torchvision's
            messages] in ``cachepipe.source.scan``) and lists what was found.
        FileNotFoundError: ``root`` does not exist.
        ValueError: a bad ``on_error`` or ``output``, ``extensions`` with
            ``is_valid_file``, or a ``cache`` built for other files.

    Example:
        >>> ds = CachedImageFolder("/data/train", cache_dir="/local/cache")  # doctest: +SKIP
        >>> img, label = ds[0]  # doctest: +SKIP
        >>> tv = CachedImageFolder("/data/train", torchvision_transform, cache_dir="/local/cache",
        ...                        output="pil")  # doctest: +SKIP
    """

    # NOTE [torchvision arguments]
    # extensions / is_valid_file / allow_empty, and a subclass's find_classes() (called
    # with the root, as torchvision's DatasetFolder does), choose the files: the manifest is
    # scanned with those rules (Manifest.scan), and the cache serves it like any other (its
    # own fingerprint, so its own L1 mirror and L2 namespace). A custom loader changes the
    # pixels themselves, which the cache cannot know, so it is honoured by not caching:
    # every read calls loader(path), as torchvision does. ``ds.loader`` is always a
    # callable, as torchvision's: the custom loader, else a FileLoader giving the cache's
    # pixels (set at construction; assigning another afterwards changes nothing).

    def __init__(self, root: str | os.PathLike, transform: Callable | None = None,
                 target_transform: Callable | None = None, loader: Callable[[str], Any] | None = None,
                 is_valid_file: Callable[[str], bool] | None = None, allow_empty: bool = False, *,
                 extensions: str | Sequence[str] | None = None, cache=None, cache_dir=None, redis=None, l2=None,
                 cache_size: int = 256, on_error: str = "raise", output: str = "numpy",
                 follow_external_links: bool = False) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"unknown on_error {on_error!r}; valid: {list(ON_ERROR)}")
        if output not in OUTPUTS:
            raise ValueError(f"unknown output {output!r}; valid: {list(OUTPUTS)}")
        chosen = None  # NOTE [torchvision arguments]: a find_classes() override chooses the classes
        if type(self).find_classes is not CachedImageFolder.find_classes:
            chosen = dict(self.find_classes(os.fspath(root))[1])
        custom = extensions is not None or is_valid_file is not None or allow_empty or chosen is not None
        manifest = (Manifest.scan(root, extensions=extensions, is_valid_file=is_valid_file, allow_empty=allow_empty,
                                  follow_external_links=follow_external_links, class_to_idx=chosen)
                    if custom or cache is False or loader is not None else None)
        if loader is not None and cache is not False:
            warnings.warn("CachedImageFolder(loader=...): every sample is loader(path) of its file; the cache is "
                          "not used (it holds decode_and_resize pixels, not the loader's). Pass cache=False to "
                          "say so and silence this.", UserWarning, stacklevel=2)
            cache = False
        self._owns_cache = cache is None or isinstance(cache, CacheConfig)
        if cache is None:
            if cache_dir is None:
                raise ValueError("pass cache_dir (the local L1 directory), a CacheConfig or TwoLevelCache as "
                                 "cache=, or cache=False to read the files directly")
            cache = CacheConfig(os.fspath(root), os.fspath(cache_dir), l2_setting(l2, redis), cache_size,
                                follow_external_links=follow_external_links)
        if isinstance(cache, CacheConfig):
            if cache.source != os.path.abspath(root):
                raise ValueError(f"the cache config given is of {cache.source!r}, not {os.path.abspath(root)!r}")
            cache = TwoLevelCache(cache, manifest=manifest)
        if cache is False:
            self.cache = None
            self.manifest = manifest
            self.cache_size = int(cache_size)
        else:
            self.cache = cache
            self.manifest = cache.manifest
            self.cache_size = int(cache.config.cache_size)
            if os.path.abspath(os.fspath(root)) != self.manifest.root:
                raise ValueError(f"the cache given serves {self.manifest.root!r}, not {os.path.abspath(root)!r}")
            if manifest is not None and manifest.fingerprint != self.manifest.fingerprint:
                raise ValueError("the cache given serves other files of this root than extensions/is_valid_file/"
                                 "allow_empty choose; build it from Manifest.scan with the same rules")
        self.root = self.manifest.root
        self.transform, self.target_transform = transform, target_transform
        datasets = torchvision_datasets()  # VisionDataset's joint transforms (NOTE [torchvision base class])
        self.transforms = (datasets.vision.StandardTransform(transform, target_transform)
                           if datasets is not None and (transform or target_transform) else None)
        self._custom_loader = loader  # what reads the files when it is not None (NOTE [torchvision arguments])
        self.loader = loader if loader is not None else FileLoader(self.cache_size, output)
        self.extensions, self.output = extensions, output
        self.on_error = on_error
        self.classes = list(self.manifest.classes)
        self.class_to_idx = dict(self.manifest.class_to_idx)
        # NOTE [lazy sample lists]: torchvision's lists, as views of the manifest's mapped arrays
        self.samples = Samples(self.manifest, root=self.root)
        self.imgs = self.samples  # torchvision's alias
        self.targets = self.manifest.targets
        self.skipped: list[int] = []  # indices left out (on_error="skip"), in this process
        self._warned: set[int] = set()  # bad samples already warned about, in this process
        self._why: dict[int, str] = {}  # what was wrong with a bad sample

    def find_classes(self, directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
        """torchvision's ``find_classes``: the class folders of ``directory``, sorted, as
        ``(classes, class_to_idx)``, with cachepipe's link rules (NOTE [symlinks in the
        source] in ``cachepipe.source.scan``). A subclass may override it, as torchvision's
        ``DatasetFolder`` allows, to choose the classes and their labels (0..n-1): the
        samples are then the files of those classes (NOTE [torchvision arguments])."""
        root = os.path.abspath(os.fspath(directory))
        classes = Walker(root).classes(root)
        return classes, {c: i for i, c in enumerate(classes)}

    def __len__(self) -> int:
        return len(self.samples)

    def __repr__(self) -> str:
        source = ("loader" if self._custom_loader is not None else "files") if self.cache is None else type(self.cache).__name__
        return (f"CachedImageFolder(root={self.root!r}, samples={len(self)}, classes={len(self.classes)}, "
                f"cache_size={self.cache_size}, source={source})")

    # ---- raw samples ------------------------------------------------------------------
    def _read_file(self, index: int):
        path = self.samples[index][0]
        if self._custom_loader is not None:
            return self._custom_loader(path)
        data = read_file(path)  # never blocks on a FIFO nor reads a 40 GB file whole (NOTE [bounded reads])
        return decode_and_resize(data, self.cache_size, index=index, path=self.manifest.relpath(index))

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

    def _fetch(self, indices: list[int], skip: bool, copy: bool) -> list[np.ndarray | None]:
        """Samples of ``indices``; with ``skip`` a bad one (corrupt, unreadable) is ``None``
        and what was wrong with it goes to ``self._why``."""
        if self.cache is not None:
            try:
                return self.cache.get_many(indices, errors="skip" if skip else "raise", copy=copy)
            finally:
                self._why.update(self.cache.last_errors)
        arrays = []
        # a custom loader's errors pass through as torchvision's do; "skip" replaces them
        bad = (CorruptSampleError, OSError) if self._custom_loader is None else (OSError, ValueError)
        for i in indices:
            try:
                arrays.append(self._read_file(i))
            except bad as exc:
                if not skip:
                    if self._custom_loader is not None or isinstance(exc, CorruptSampleError):
                        raise
                    raise CorruptSampleError(f"cannot read the file ({exc})", index=i,
                                             path=self.manifest.relpath(i)) from exc
                self._why[i] = exc.reason if isinstance(exc, CorruptSampleError) else f"{type(exc).__name__}: {exc}"
                arrays.append(None)
        return arrays

    def read_ahead(self, indices: Sequence[int]) -> int:
        """Start the source reads of the samples of ``indices`` the cache lacks, when the
        last batch missed it (NOTE [loader read-ahead]); returns how many were started."""
        return self.cache.read_ahead(indices) if self.cache is not None else 0

    # NOTE [bad samples reported once]: a bad sample (corrupt, unreadable, too large) is one
    # warning line per file and process, naming the file and what was wrong: the cache does
    # not warn about it (it counts it and says why in ``last_errors``), and a file already
    # reported is not reported again when a later batch (the next epoch, in a persistent
    # worker) meets it; it is still counted in ``skipped`` every time it is replaced.
    def load_many(self, indices: Sequence[int], *,
                  copy: bool = True) -> tuple[list[np.ndarray], list[int], list[int]]:
        """Untransformed samples of a batch: ``(samples, targets, skipped_indices)``.

        One round trip (an MGET) per Redis shard. With ``on_error="skip"`` a bad sample
        (corrupt or unreadable) is warned about, returned in ``skipped_indices`` and
        replaced by another drawn from the batch's seed, so the batch stays full (NOTE
        [replacing bad samples] in ``loaders.replacement``); otherwise it raises.
        ``copy=False`` returns cached samples as read-only views of the Redis reply (for
        callers that crop them anyway).
        """
        if self.on_error == "raise":
            idx = [int(i) for i in indices]
            return self._fetch(idx, False, copy), [self.targets[i] for i in idx], []
        key = getattr(indices, "seed", "")
        samples, used, skipped = fill_batch(lambda idx: self._fetch(idx, True, copy), indices, key=key,
                                            num_samples=len(self), name=lambda i: self.samples[i][0])
        self.skipped.extend(skipped)
        new = list(dict.fromkeys(i for i in skipped if i not in self._warned))  # NOTE [bad samples reported once]
        if new:
            self._warned.update(new)
            names = ", ".join(f"{self.samples[i][0]} ({self._why.get(i, 'bad')})" for i in new[:3])
            warnings.warn(f"skipped {len(new)} bad sample(s) and replaced them (on_error='skip'): {names}"
                          + (f" and {len(new) - 3} more" if len(new) > 3 else ""), RuntimeWarning, stacklevel=2)
        return samples, [self.targets[i] for i in used], skipped

    # ---- torchvision Dataset protocol -------------------------------------------------
    def _apply(self, sample, target):
        if self.output == "pil" and self._custom_loader is None:
            sample = Image.fromarray(sample)
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

        With ``on_error="skip"`` bad samples are replaced (NOTE [replacing bad samples]).
        """
        samples, targets, _ = self.load_many(indices)
        return [self._apply(s, t) for s, t in zip(samples, targets)]

    def close(self) -> None:
        """Close this process's cache handles when this dataset opened the cache (a shared
        ``cache=`` stays open; the embedded Redis server keeps running for other processes)."""
        if self.cache is not None and self._owns_cache:
            self.cache.close()
