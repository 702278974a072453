"""Data loaders for training, by name: ``torch`` (cached DataLoader), ``dali``, ``memory``.

Every loader yields ``(images float NCHW, labels int64)`` and has ``len()``,
``set_epoch(e)``, ``set_size(s)``, ``state_dict()`` / ``load_state_dict()`` (mid-epoch
position), so the training loop does not care which one it drives.

- ``torch``: ``loaders.cached_dataloader`` reading from the two-level cache (L2 Redis, L1 LMDB).
- ``dali``: ``loaders.build_dali_loader`` fed from the same cache (GPU or DALI CPU mode).
- ``memory``: decodes the split once into RAM, no cache (tests, reference runs).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.data.memory import IMAGE_SUFFIXES, MemoryLoader, SyntheticLoader, load_split

__all__ = ["LOADERS", "LoaderSpec", "make_loader", "check_data_root", "count_classes", "MemoryLoader", "SyntheticLoader"]

LOADERS = ("torch", "dali", "memory")


@dataclass(frozen=True)
class LoaderSpec:
    """Where and how one rank reads its data (everything but the phase)."""

    kind: str
    root: str
    rank: int = 0
    world_size: int = 1
    seed: int = 0
    cache_dir: str | None = None
    redis: tuple[str, ...] | None = None
    cache_size: int = 256
    workers: int = 0
    device: str = "cpu"

    def __post_init__(self):
        if self.kind not in LOADERS:
            raise ValueError(f"unknown loader {self.kind!r}; valid: {list(LOADERS)}")


def check_data_root(root: str | Path) -> int:
    """Return the number of classes under ``root/train`` after checking the layout.

    Raises:
        ValueError: one line saying what is missing (``train/`` and ``val/`` folders of
            ``<class>/<image>`` files, with the same classes).
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"data root {str(root)!r} does not exist; pass --data DIR with train/ and val/ "
                         f"(or make one: cachepipe make-dataset DIR)")
    classes = {}
    for split in ("train", "val"):
        folder = root / split
        names = sorted(d.name for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else []
        if not names or not any(f.suffix.lower() in IMAGE_SUFFIXES for f in (folder / names[0]).iterdir()):
            raise ValueError(f"data root {str(root)!r} lacks {split}/<class>/<image> files "
                             f"(expected the ImageFolder layout {root}/{{train,val}}/<class>/<file>.JPEG)")
        classes[split] = names
    if classes["train"] != classes["val"]:
        raise ValueError(f"data root {str(root)!r}: train/ has {len(classes['train'])} classes and val/ "
                         f"{len(classes['val'])}; they must have the same class folders")
    return len(classes["train"])


def count_classes(root: str | Path) -> int:
    """Number of class folders under ``root/train``."""
    return sum(1 for d in (Path(root) / "train").iterdir() if d.is_dir())


_DECODED: dict = {}


def make_loader(spec: LoaderSpec, *, train: bool, batch_size: int, size: int):
    """Build ``spec.kind``'s loader for the train or val split at ``size`` px.

    Raises:
        ValueError: when the chosen loader's package is missing (names the alternative).
    """
    if spec.kind == "memory":
        split = "train" if train else "val"
        key = (spec.root, split, spec.cache_size)
        if key not in _DECODED:
            _DECODED[key] = load_split(spec.root, split, spec.cache_size)[:2]
        images, labels = _DECODED[key]
        return MemoryLoader(images, labels, batch_size=batch_size, train=train, size=size,
                            rank=spec.rank, world_size=spec.world_size, seed=spec.seed)
    try:
        import loaders
    except ImportError:  # pragma: no cover - the package is part of the repository
        loaders = None
    # NOTE [loader contract]: the cached loaders shard by (rank, world_size) themselves and
    # give every rank the same number of training batches; see loaders.cached_dataloader.
    distributed = (spec.rank, spec.world_size) if spec.world_size > 1 else None
    redis = list(spec.redis) if spec.redis is not None else None
    if spec.kind == "torch":
        fn = getattr(loaders, "cached_dataloader", None)
        if fn is None:
            raise ValueError("--loader torch needs loaders.cached_dataloader, which this checkout lacks; use --loader memory")
        return fn(spec.root, batch_size=batch_size, train=train, size=size, workers=spec.workers,
                  cache_dir=spec.cache_dir, redis=redis, distributed=distributed, seed=spec.seed,
                  drop_last=train, cache_size=spec.cache_size)
    fn = getattr(loaders, "build_dali_loader", None)
    if fn is None:
        raise ValueError("--loader dali needs loaders.build_dali_loader and nvidia-dali (pip install 'cachepipe[dali]')")
    return fn(spec.root, batch_size=batch_size, train=train, size=size, device=spec.device, shard_id=spec.rank,
              num_shards=spec.world_size, seed=spec.seed, cache_dir=spec.cache_dir, redis=redis, workers=spec.workers)
