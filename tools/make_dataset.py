"""``cachepipe make-dataset DIR``: a small learnable ImageNet-layout dataset of real JPEGs."""
from __future__ import annotations

import argparse
import sys

__all__ = ["configure", "main"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", metavar="DIR", help="output directory (gets train/ and val/)")
    parser.add_argument("--classes", type=int, default=10, help="number of classes (>= 2)")
    parser.add_argument("--per-class", type=int, default=100, help="training images per class")
    parser.add_argument("--val-per-class", type=int, default=20,
                        help="validation images per class (0: no val/)")
    parser.add_argument("--size", type=int, default=96, help="typical image side in pixels, 16 to 2048")
    parser.add_argument("--seed", type=int, default=0, help="the dataset is a pure function of its flags")


def main(args: argparse.Namespace) -> int:
    from tools.cli import UsageError
    from tools.demo_dataset import MAX_SIZE, make_dataset

    for flag, value, low, high in (("--classes", args.classes, 2, None), ("--per-class", args.per_class, 1, None),
                                   ("--val-per-class", args.val_per_class, 0, None),
                                   ("--size", args.size, 16, MAX_SIZE)):
        if value < low or (high is not None and value > high):
            raise UsageError(f"{flag} {value}: must be " + (f"in [{low}, {high}] (a typical image side in pixels; "
                             f"each image is drawn in memory)" if high else f">= {low}"))
    try:
        root = make_dataset(args.root, classes=args.classes, per_class=args.per_class,
                            val_per_class=args.val_per_class, size=args.size, seed=args.seed)
    except (ValueError, OSError) as exc:
        print(f"cachepipe make-dataset: error: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, OSError) else 2
    n_train = args.classes * args.per_class
    n_val = args.classes * args.val_per_class
    print(f"wrote {n_train} training images to {root / 'train'}"
          + (f" and {n_val} validation images to {root / 'val'}" if n_val else "")
          + f" ({args.classes} classes)")
    return 0
