"""decode_and_resize: the modes ImageNet holds, the resize policy, clear per-file errors."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from cachepipe import CorruptSampleError, decode_and_resize
from cachepipe.decode import MAX_ASPECT, resized_shape
from tests.cachepipe.conftest import reference_pixels


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def rgb():
    rng = np.random.default_rng(1)
    return Image.fromarray(rng.integers(0, 256, (60, 90, 3), dtype=np.uint8), "RGB")


def test_matches_plain_pillow_on_dataset_files(tiny_dataset):
    files = sorted((tiny_dataset / "train").rglob("*.JPEG"))[:6]
    for f in files:
        data = f.read_bytes()
        for size in (32, 48, 100):
            out = decode_and_resize(data, size)
            np.testing.assert_array_equal(out, reference_pixels(data, size))
            assert out.flags.writeable and out.flags.c_contiguous and out.dtype == np.uint8


@pytest.mark.parametrize("mode,fmt", [("L", "JPEG"), ("CMYK", "JPEG"), ("P", "PNG"),
                                      ("RGBA", "PNG"), ("LA", "PNG"), ("RGB", "PNG"),
                                      ("I;16", "PNG"), ("1", "BMP"), ("RGB", "WEBP")])
def test_modes_become_rgb(rgb, mode, fmt):
    img = rgb.convert(mode) if mode != "I;16" else Image.fromarray(
        np.asarray(rgb.convert("L"), dtype=np.uint16) * 257)
    out = decode_and_resize(_encode(img, fmt), 30)
    assert out.shape == (30, 45, 3) and out.dtype == np.uint8
    # torchvision's pil_loader: convert("RGB") (NOTE [torchvision's pixels]); lossy formats give their own pixels
    expect = np.asarray(Image.open(io.BytesIO(_encode(img, fmt))).convert("RGB").resize((45, 30), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(out, expect)


def test_png_content_with_jpeg_name(rgb, tmp_path):
    path = tmp_path / "really_png.JPEG"
    path.write_bytes(_encode(rgb, "PNG"))
    out = decode_and_resize(path.read_bytes(), 60)
    np.testing.assert_array_equal(out, np.asarray(rgb))  # already 60 on the short side: unchanged


def test_truncated_and_non_image_name_the_file(rgb):
    data = _encode(rgb, "JPEG", quality=95)
    with pytest.raises(CorruptSampleError, match=r"file 'cls/broken\.JPEG', sample 7.*truncated") as ei:
        decode_and_resize(data[: len(data) // 2], 32, index=7, path="cls/broken.JPEG")
    assert (ei.value.index, ei.value.path) == (7, "cls/broken.JPEG") and "truncated" in ei.value.reason
    assert isinstance(ei.value, ValueError)
    with pytest.raises(CorruptSampleError, match="not an image"):
        decode_and_resize(b"<html>not found</html>", 32, path="x.jpg")
    with pytest.raises(CorruptSampleError):
        decode_and_resize(b"", 32)
    with pytest.raises(ValueError, match="cache_size"):
        decode_and_resize(data, 0)


def test_resize_policy_small_and_extreme():
    assert resized_shape(10, 20, 256) == (256, 512)  # small images are upscaled
    assert resized_shape(300, 200, 256) == (384, 256)
    assert resized_shape(256, 341, 256) == (256, 341)
    assert resized_shape(100, 10_000, 256) == (256 * 8 * 100 // 10_000, 256 * MAX_ASPECT)  # capped
    assert resized_shape(10_000, 1, 32) == (256, 1)  # 1-pixel lines keep at least 1 pixel
    img = Image.new("RGB", (4000, 100), (10, 200, 30))
    out = decode_and_resize(_encode(img, "PNG"), 64)
    assert out.shape == (64 * 8 * 100 // 4000, 512, 3)
    assert np.all(out == np.array([10, 200, 30], dtype=np.uint8))
