"""Crop geometry shared by the torch and DALI paths: torchvision's sampling rules, in pure Python.

Both loaders draw their crop windows here, so they sample from the same distribution and,
given the same seed, the very same windows (see NOTE [DALI crop parameters]).
"""
from __future__ import annotations

import math
import random
from typing import NamedTuple

__all__ = ["CropWindow", "random_resized_crop_window", "center_crop_window", "resize_shorter_dims",
           "DEFAULT_SCALE", "DEFAULT_RATIO", "VAL_RESIZE_FRACTION"]

DEFAULT_SCALE = (0.08, 1.0)
DEFAULT_RATIO = (3.0 / 4.0, 4.0 / 3.0)
# Validation resizes the shorter side to ``size / 0.875`` (256 for 224), then center-crops.
VAL_RESIZE_FRACTION = 0.875


class CropWindow(NamedTuple):
    """A crop ``img[top:top + height, left:left + width]`` in pixel coordinates."""

    top: int
    left: int
    height: int
    width: int


def random_resized_crop_window(height: int, width: int, rng: random.Random,
                               scale: tuple[float, float] = DEFAULT_SCALE,
                               ratio: tuple[float, float] = DEFAULT_RATIO) -> CropWindow:
    """Sample a crop window by torchvision's ``RandomResizedCrop.get_params`` rule.

    Up to 10 tries draw an area fraction uniformly from ``scale`` and an aspect ratio
    log-uniformly from ``ratio``; the first window that fits is placed uniformly at random.
    When none fits, the fallback is a central crop clamped to the ratio range (the whole
    image when its own ratio lies inside the range). Only the random source differs from
    torchvision (``rng`` here, torch's global generator there).

    Args:
        height: sample height in pixels (>= 1).
        width: sample width in pixels (>= 1).
        rng: the random source (``random.Random``).
        scale: (min, max) fraction of the sample area, ``0 < min <= max``.
        ratio: (min, max) width/height aspect ratio, ``0 < min <= max``.

    Returns:
        The window; always inside the sample.

    Raises:
        ValueError: for an empty sample or inverted/non-positive ranges.

    Example:
        >>> random_resized_crop_window(256, 320, random.Random(0))
        CropWindow(top=6, left=2, height=246, width=285)
    """
    if height < 1 or width < 1:
        raise ValueError(f"cannot crop an empty sample of {height}x{width} pixels")
    if not (0 < scale[0] <= scale[1]) or not (0 < ratio[0] <= ratio[1]):
        raise ValueError(f"need 0 < scale[0] <= scale[1] and 0 < ratio[0] <= ratio[1]; got {scale=}, {ratio=}")
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return CropWindow(top, left, h, w)
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return CropWindow((height - h) // 2, (width - w) // 2, h, w)


def resize_shorter_dims(height: int, width: int, shorter: int) -> tuple[int, int]:
    """(new_height, new_width) after resizing the shorter side to ``shorter``.

    The longer side is ``int(shorter * long / short)``, as torchvision's ``Resize(int)``.
    """
    if height <= width:
        return shorter, int(shorter * width / height)
    return int(shorter * height / width), shorter


def center_crop_window(height: int, width: int, crop: int) -> CropWindow:
    """The central ``crop x crop`` window, rounded as torchvision's ``center_crop``.

    Raises:
        ValueError: when the sample is smaller than the crop.
    """
    if crop > height or crop > width:
        raise ValueError(f"center crop {crop} does not fit a {height}x{width} sample")
    return CropWindow(int(round((height - crop) / 2.0)), int(round((width - crop) / 2.0)), crop, crop)
