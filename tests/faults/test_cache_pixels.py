"""Issue 32, items 3 and 4: cached pixels are torchvision's for every image mode, and the
decompression-bomb limits are Pillow's own (warn: decoded; error: corrupt).

The oracle is torchvision's ``pil_loader`` (``Image.open(f).convert("RGB")``) followed by
the resize (``tests/cachepipe/conftest.reference_pixels``); the files are real files read
through a real L2 (redis-server) and back.
"""
from __future__ import annotations

import io
import shutil
import warnings

import numpy as np
import pytest
from PIL import Image

from cachepipe import CorruptSampleError, TwoLevelCache, decode_and_resize
from tests.cachepipe.conftest import reference_pixels

SIZE = 20
_RNG = np.random.default_rng(0)
_RGB = Image.fromarray((_RNG.random((24, 36, 3)) * 255).astype(np.uint8))
_GRAY16 = (_RNG.random((24, 36)) * 300).astype(np.uint16)  # a dark 16-bit image: max ~300 of 65535


def _image(mode: str) -> Image.Image:
    if mode in ("I;16", "I;16B"):
        return Image.fromarray(_GRAY16).convert(mode) if mode != "I;16" else Image.fromarray(_GRAY16)
    if mode == "I":
        return Image.fromarray(_GRAY16.astype(np.int32) * 3, "I")  # 0..900
    if mode == "F":
        return Image.fromarray(_GRAY16.astype(np.float32) / 1.5, "F")  # 0..200, fractional
    return _RGB.convert(mode)


# (mode, a format that stores it as that mode)
MODES = [("1", "PNG"), ("L", "PNG"), ("LA", "PNG"), ("P", "PNG"), ("PA", "TIFF"), ("RGB", "PNG"),
         ("RGBA", "PNG"), ("CMYK", "JPEG"), ("CMYK", "TIFF"), ("YCbCr", "TIFF"), ("I", "TIFF"), ("I;16", "PNG"),
         ("I;16", "TIFF"), ("I;16B", "TIFF"), ("F", "TIFF"), ("LAB", "TIFF")]


def _file(mode: str, fmt: str) -> bytes:
    buf = io.BytesIO()
    _image(mode).save(buf, fmt)
    data = buf.getvalue()
    assert Image.open(io.BytesIO(data)).mode == mode  # the file really holds that mode
    return data


@pytest.mark.parametrize("mode,fmt", MODES)
def test_every_mode_decodes_to_torchvision_pixels(mode, fmt):
    data = _file(mode, fmt)
    np.testing.assert_array_equal(decode_and_resize(data, SIZE), reference_pixels(data, SIZE))


def test_sixteen_bit_images_come_back_from_l2_as_torchvision_makes_them(tmp_path, redis_server):
    src = tmp_path / "src"
    files = {}
    for k, (mode, fmt) in enumerate(m for m in MODES if m[0] in ("I", "I;16", "I;16B", "F")):
        path = src / "wide" / f"{k}.{fmt.lower()}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_file(mode, fmt))
        files[k] = path
    with TwoLevelCache(src, tmp_path / "cache", [redis_server.url], SIZE) as cache:
        cache.get_many(range(len(files)))  # decoded from the source, written to L2
    with TwoLevelCache(src, tmp_path / "cache", [redis_server.url], SIZE, use_l1=False) as cache:
        got = cache.get_many(range(len(files)))
        assert cache.stats()["l2_hits"] == len(files)
    for k, path in files.items():
        expect = reference_pixels(path.read_bytes(), SIZE)
        np.testing.assert_array_equal(got[k], expect)
    assert got[1].mean() > 100  # the image: ~146 in torchvision, was 0.2 in the cache


@pytest.fixture
def small_bomb_limit(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # warn above 1000 px, error above 2000


def _png(side: int) -> bytes:
    buf = io.BytesIO()
    _RGB.resize((side, side)).save(buf, "PNG")
    return buf.getvalue()


def test_images_pillow_only_warns_about_are_samples(small_bomb_limit, tmp_path):
    data = _png(40)  # 1600 px: Pillow warns, torchvision loads it
    with pytest.warns(Image.DecompressionBombWarning):
        out = decode_and_resize(data, SIZE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        np.testing.assert_array_equal(out, reference_pixels(data, SIZE))
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "big.png").write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with TwoLevelCache(src.parent, tmp_path / "cache", False, SIZE) as cache:
            assert cache.get_many([0], errors="skip")[0] is not None and cache.stats()["corrupt"] == 0


def test_images_pillow_rejects_stay_corrupt(small_bomb_limit, tmp_path):
    with pytest.raises(CorruptSampleError, match="DecompressionBombError"):
        decode_and_resize(_png(50), SIZE)  # 2500 px > 2 x 1000: Pillow refuses it
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "huge.png").write_bytes(_png(50))
    with TwoLevelCache(src.parent, tmp_path / "cache", False, SIZE) as cache:
        assert cache.get_many([0], errors="skip") == [None] and cache.stats()["corrupt"] == 1
    shutil.rmtree(tmp_path / "cache")
