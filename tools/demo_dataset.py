"""Small, learnable ImageNet-layout datasets of real JPEG files, for demos and tests.

Each class has its own hue and stripe orientation; every image adds random size,
aspect ratio, phase, brightness and pixel noise, so a small CNN learns the classes in a
few CPU epochs while no two files are alike.
"""
from __future__ import annotations

import colorsys
import io
import os
from pathlib import Path

import numpy as np
from PIL import Image

from trainer.atomic_file import write_atomic

__all__ = ["MAX_SIZE", "make_dataset", "make_image"]

# Largest typical side: an image is drawn in float64 at up to 1.25 x 4/3 times it per side
# (~210 MB at 2048 px, ~4 GB for each one at 10,000); 2048 is four times ImageNet's typical side.
MAX_SIZE = 2048


def make_image(label: int, num_classes: int, rng: np.random.Generator, size: int = 96) -> Image.Image:
    """Draw one RGB image of class ``label`` (aspect ratio and size vary around ``size``)."""
    aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
    h = max(16, int(round(size * rng.uniform(0.8, 1.25))))
    w = max(16, int(round(h * aspect)))
    hue = (label / num_classes + rng.normal(0.0, 0.02)) % 1.0
    base = np.array(colorsys.hsv_to_rgb(hue, 0.75, 0.85))
    angle = np.pi * label / num_classes  # stripe orientation per class
    period = rng.uniform(0.15, 0.25) * min(h, w)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi)
    stripes = 0.5 + 0.5 * np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period + phase)
    img = base[None, None, :] * (0.55 + 0.45 * stripes[..., None]) * rng.uniform(0.8, 1.2)
    img = img + rng.normal(0.0, 0.06, size=img.shape)
    return Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8), "RGB")


def make_dataset(root: str | os.PathLike, *, classes: int = 10, per_class: int = 100,
                 val_per_class: int = 20, size: int = 96, seed: int = 0) -> Path:
    """Write ``root/train/<class>/<n>.JPEG`` and ``root/val/<class>/<n>.JPEG``.

    Args:
        root: output directory (created).
        classes: number of classes (>= 2).
        per_class: training images per class (>= 1).
        val_per_class: validation images per class (>= 0; 0 writes no ``val/``).
        size: typical image side in pixels, in [16, ``MAX_SIZE``].
        seed: the dataset is a pure function of its arguments.

    Returns:
        ``Path(root)``.

    Raises:
        ValueError: for out-of-range arguments.

    Example:
        >>> make_dataset("/tmp/demo", classes=4, per_class=8, val_per_class=2)  # doctest: +SKIP
    """
    if classes < 2 or per_class < 1 or val_per_class < 0 or not 16 <= size <= MAX_SIZE:
        raise ValueError(f"need classes >= 2, per_class >= 1, val_per_class >= 0, 16 <= size <= {MAX_SIZE}; "
                         f"got {classes=}, {per_class=}, {val_per_class=}, {size=}")
    root = Path(root)
    for split, count in (("train", per_class), ("val", val_per_class)):
        if count == 0:
            continue
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        for label in range(classes):
            folder = root / split / f"class_{label:04d}"
            folder.mkdir(parents=True, exist_ok=True)
            for n in range(count):
                jpeg = io.BytesIO()
                make_image(label, classes, rng, size).save(jpeg, format="JPEG", quality=90)
                write_atomic(folder / f"{split}_{label:04d}_{n:05d}.JPEG", jpeg.getbuffer())
    return root
