"""Torch transforms on uint8 HWC samples: geometry, flips, normalisation, layouts, dtypes."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image

from loaders.crop import CropWindow
from loaders.transforms import IMAGENET_MEAN, IMAGENET_STD, TrainTransform, ValTransform, normalize


def coordinate_image(height: int, width: int) -> np.ndarray:
    """R = row, G = column, B = 0: every output pixel tells where in the sample it came from."""
    img = np.zeros((height, width, 3), np.uint8)
    img[..., 0] = np.arange(height)[:, None]
    img[..., 1] = np.arange(width)[None, :]
    return img


def test_train_crops_stay_inside_the_window_they_were_drawn_from():
    img = coordinate_image(200, 250)
    t = TrainTransform(size=32, normalize=False, dtype="uint8")
    for seed in range(60):
        win, flip = t.plan(200, 250, random.Random(seed))
        out = t(img, random.Random(seed))  # same seed -> same window and flip
        assert out.shape == (3, 32, 32) and out.dtype == torch.uint8
        rows, cols = out[0].int(), out[1].int()
        # bilinear resampling only mixes neighbouring pixels of the window
        assert win.top - 1 <= rows.min() and rows.max() <= win.top + win.height
        assert win.left - 1 <= cols.min() and cols.max() <= win.left + win.width
        left_to_right = cols[:, -1].float().mean() - cols[:, 0].float().mean()
        if win.width > 4:
            assert (left_to_right < 0) == flip, (seed, win, flip)


def test_flip_probability_and_determinism():
    t = TrainTransform(size=8)
    flips = [t.plan(64, 64, random.Random(s))[1] for s in range(400)]
    assert 150 < sum(flips) < 250
    assert not any(TrainTransform(size=8, flip_prob=0.0).plan(64, 64, random.Random(s))[1] for s in range(50))
    a = t.batch([coordinate_image(64, 80)] * 3, random.Random(7))
    b = t.batch([coordinate_image(64, 80)] * 3, random.Random(7))
    assert torch.equal(a, b)


def test_float_output_is_the_normalised_uint8_output():
    img = np.random.default_rng(0).integers(0, 256, (90, 120, 3), dtype=np.uint8)
    raw = TrainTransform(size=40, normalize=False, dtype="uint8").batch([img, img], random.Random(1))
    flt = TrainTransform(size=40).batch([img, img], random.Random(1))
    assert flt.dtype == torch.float32 and flt.shape == (2, 3, 40, 40)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(flt, (raw.float() / 255 - mean) / std, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(normalize(raw), flt, rtol=1e-5, atol=1e-5)
    half = TrainTransform(size=40, dtype="float16").batch([img, img], random.Random(1))
    torch.testing.assert_close(half.float(), flt, rtol=1e-3, atol=1e-2)


def test_channels_last_layout_keeps_values():
    img = np.random.default_rng(1).integers(0, 256, (70, 70, 3), dtype=np.uint8)
    a = ValTransform(size=48).batch([img])
    b = ValTransform(size=48, channels_last=True).batch([img])
    assert b.is_contiguous(memory_format=torch.channels_last) and a.is_contiguous()
    assert torch.equal(a, b)


def test_val_is_a_pure_center_crop_when_the_sample_is_already_at_size_over_0875():
    img = np.random.default_rng(2).integers(0, 256, (256, 301, 3), dtype=np.uint8)
    out = ValTransform(size=224, normalize=False, dtype="uint8")(img)
    expected = torch.from_numpy(img[16:240, 38:262]).permute(2, 0, 1)  # torchvision's rounding
    assert torch.equal(out, expected)


def test_val_resize_matches_pillow_bilinear():
    rng = np.random.default_rng(3)
    img = (rng.integers(0, 256, (16, 20, 3)).repeat(16, 0).repeat(16, 1)).astype(np.uint8)  # 256x320, smooth-ish
    out = ValTransform(size=112, normalize=False, dtype="uint8")(img)  # resize shorter to 128, crop 112
    ref = np.array(Image.fromarray(img).resize((160, 128), Image.BILINEAR))[8:120, 24:136]
    diff = (out.permute(1, 2, 0).int() - torch.from_numpy(ref).int()).abs()
    assert diff.float().mean() < 0.5 and diff.max() <= 2


def test_single_sample_call_and_batches_of_mixed_sizes():
    t = TrainTransform(size=24)
    samples = [coordinate_image(40, 60), coordinate_image(100, 30), torch.from_numpy(coordinate_image(24, 24))]
    out = t.batch(samples, random.Random(0))
    assert out.shape == (3, 3, 24, 24)
    assert t(samples[0]).shape == (3, 24, 24)
    assert t.batch(samples, random.Random(0), size=16).shape == (3, 3, 16, 16)


@pytest.mark.parametrize("kwargs,match", [
    (dict(size=0), "size"),
    (dict(dtype="int32"), "unknown dtype"),
    (dict(dtype="uint8"), "normalize=False"),
    (dict(normalize=False), "dtype='uint8'"),
    (dict(scale=(0.5, 0.1)), "scale"),
    (dict(flip_prob=2.0), "flip_prob"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainTransform(**kwargs)


def test_rejects_non_rgb_uint8_samples():
    with pytest.raises(ValueError, match="uint8 HWC"):
        TrainTransform(size=8)(np.zeros((10, 10), np.uint8))
    with pytest.raises(ValueError, match="uint8 HWC"):
        TrainTransform(size=8)(np.zeros((10, 10, 3), np.float32))


def test_crop_window_type_is_public():
    assert CropWindow(1, 2, 3, 4).height == 3
