"""Crop geometry against torchvision's rules (reference code transcribed from torchvision)."""
from __future__ import annotations

import math
import random

import pytest
import torch

from loaders.crop import center_crop_window, random_resized_crop_window, resize_shorter_dims


def torchvision_get_params(height, width, scale, ratio, g):
    """``torchvision.transforms.RandomResizedCrop.get_params`` verbatim, drawing from ``g`` in float64."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio, dtype=torch.float64))
    for _ in range(10):
        target_area = area * torch.empty(1, dtype=torch.float64).uniform_(scale[0], scale[1], generator=g).item()
        aspect_ratio = torch.exp(torch.empty(1, dtype=torch.float64).uniform_(
            log_ratio[0], log_ratio[1], generator=g)).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,), generator=g).item()
            j = torch.randint(0, width - w + 1, size=(1,), generator=g).item()
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    i = (height - h) // 2
    j = (width - w) // 2
    return i, j, h, w


class TorchDraws:
    """A ``random.Random``-shaped adapter drawing exactly as torchvision does from generator ``g``."""

    def __init__(self, g):
        self.g = g

    def uniform(self, a, b):
        return torch.empty(1, dtype=torch.float64).uniform_(a, b, generator=self.g).item()

    def randint(self, a, b):
        return torch.randint(a, b + 1, size=(1,), generator=self.g).item()


@pytest.mark.parametrize("height,width,scale", [(256, 341, (0.08, 1.0)), (300, 256, (0.08, 1.0)),
                                                 (8, 400, (0.08, 1.0)), (400, 9, (0.5, 1.0)), (7, 7, (0.9, 1.0))])
def test_same_windows_as_torchvision_for_the_same_draws(height, width, scale):
    ratio = (3 / 4, 4 / 3)
    for seed in range(300):
        mine = random_resized_crop_window(height, width, TorchDraws(torch.Generator().manual_seed(seed)), scale, ratio)
        ref = torchvision_get_params(height, width, scale, ratio, torch.Generator().manual_seed(seed))
        assert tuple(mine) == ref, (seed, mine, ref)


def test_fallback_is_reached_and_clamps_the_ratio():
    # a 8x400 strip cannot hold a 3/4..4/3 window of >= 8% of its area: torchvision's center fallback
    wins = {random_resized_crop_window(8, 400, random.Random(s)) for s in range(50)}
    assert wins == {(0, 194, 8, 11)}  # h = 8, w = round(8 * 4/3) = 11, left = (400 - 11) // 2


def test_windows_stay_inside_and_cover_the_scale_and_ratio_ranges():
    rng = random.Random(0)
    height, width = 256, 320
    fractions, ratios = [], []
    for _ in range(4000):
        top, left, h, w = random_resized_crop_window(height, width, rng)
        assert 0 <= top and top + h <= height and 0 <= left and left + w <= width and h > 0 and w > 0
        fractions.append(h * w / (height * width))
        ratios.append(w / h)
    # rounding to whole pixels moves the bounds by well under 2%
    assert 0.08 * 0.97 <= min(fractions) < 0.09 and 0.9 < max(fractions) <= 1.0
    assert 0.75 * 0.97 <= min(ratios) < 0.78 and 1.28 < max(ratios) <= 4 / 3 * 1.03
    # uniform in area between 0.08 and 1: the mean of the accepted draws is close to 0.54
    # (draws of big areas with extreme ratios are rejected more often, pulling it down a little)
    assert 0.45 < sum(fractions) / len(fractions) < 0.56


@pytest.mark.parametrize("h,w,crop,expected", [(256, 256, 224, (16, 16)), (256, 301, 224, (16, 38)),
                                               (257, 299, 224, (16, 38)), (225, 227, 224, (0, 2))])
def test_center_crop_rounds_like_torchvision(h, w, crop, expected):
    # torchvision: top = int(round((h - crop) / 2.0)) -- Python rounds half to even
    assert center_crop_window(h, w, crop)[:2] == expected


def test_center_crop_too_big_and_bad_arguments():
    with pytest.raises(ValueError, match="does not fit"):
        center_crop_window(100, 300, 128)
    with pytest.raises(ValueError, match="empty sample"):
        random_resized_crop_window(0, 10, random.Random(0))
    with pytest.raises(ValueError, match="scale"):
        random_resized_crop_window(10, 10, random.Random(0), scale=(0.5, 0.1))


def test_resize_shorter_truncates_the_long_side_like_torchvision():
    assert resize_shorter_dims(300, 400, 256) == (256, 341)
    assert resize_shorter_dims(400, 300, 256) == (341, 256)
    assert resize_shorter_dims(256, 256, 146) == (146, 146)
