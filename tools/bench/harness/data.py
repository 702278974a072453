"""The data a benchmark reads: its source tree (generated on request), a warm cache, and
the batches of a loader epoch after epoch."""
from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_dataset_flags", "epochs", "source_root", "warm"]


def add_dataset_flags(parser: argparse.ArgumentParser, *, image_px: int = 400) -> None:
    """``--make-dataset PER_CLASS``, ``--classes``, ``--image-px``: write a demo dataset at
    SRC first when SRC does not exist."""
    parser.add_argument("--make-dataset", type=int, default=0, metavar="PER_CLASS",
                        help="when SRC does not exist, write a demo dataset with this many ~--image-px JPEGs per "
                             "class first (0: don't)")
    parser.add_argument("--classes", type=int, default=10, help="classes of --make-dataset")
    parser.add_argument("--image-px", type=int, default=image_px, help="typical image side of --make-dataset")


def source_root(args: argparse.Namespace) -> Path:
    """The ImageFolder root of ``args.source``: ``SRC/train`` when SRC is a dataset root
    holding ``train/``, else SRC; written first when ``--make-dataset`` asks for it.

    Raises:
        UsageError: the dataset cannot be made (names the flags).
    """
    from tools.cli import UsageError
    from tools.demo_dataset import make_dataset

    src = Path(args.source)
    if not src.exists() and getattr(args, "make_dataset", 0):
        print(f"writing a demo dataset to {src}: {args.classes} classes x {args.make_dataset} images of "
              f"~{args.image_px} px", flush=True)
        try:
            make_dataset(src, classes=args.classes, per_class=args.make_dataset, val_per_class=0, size=args.image_px)
        except ValueError as exc:
            raise UsageError(f"--make-dataset {args.make_dataset} --classes {args.classes} --image-px "
                             f"{args.image_px}: {exc}") from None
    return (src / "train" if (src / "train").is_dir() else src).absolute()


def warm(cache) -> None:
    """Fill L1 and L2 with every sample of ``cache`` (a ``TwoLevelCache``), so that the
    cached loaders read L2."""
    for lo in range(0, len(cache), 256):
        cache.get_many(range(lo, min(lo + 256, len(cache))), errors="skip")


def epochs(loader):
    """The batches of ``loader``, epoch after epoch (``set_epoch`` before each), forever."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1
