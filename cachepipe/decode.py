"""Decode one image file and resize its shorter side: the reference pixels of the cache.

NOTE [resize policy]
Every sample is converted to RGB and resized so that its shorter side is exactly
``cache_size`` pixels, keeping the aspect ratio, with Pillow's antialiased bilinear
filter. The arithmetic mirrors ``torchvision.transforms.Resize(cache_size,
max_size=MAX_ASPECT * cache_size)`` on a PIL image (long side truncated with ``int``), so
a cached sample equals what a torchvision validation pipeline would produce:
- small images (shorter side < cache_size) are *upscaled*, like ``Resize`` does;
  ``RandomResizedCrop`` later picks crops by area, so nothing is lost by storing them big;
- extreme aspect ratios are capped: when the longer side would exceed
  ``MAX_ASPECT * cache_size`` (8x, e.g. 2048 px at 256), the longer side is set to that
  and the shorter side shrinks below ``cache_size`` (torchvision's ``max_size`` rule), so
  one panorama cannot take hundreds of MB of Redis memory;
- an image already at the target size is returned unchanged.
No EXIF rotation is applied (torchvision's ``pil_loader`` does not either). JPEG ``draft``
mode is not used: it changes pixels.

NOTE [torchvision's pixels]
Every mode becomes RGB by Pillow's own ``convert("RGB")``, which is what torchvision's
``pil_loader`` does (``Image.open(f).convert("RGB")``), so a cached sample equals the
torchvision one for every mode Pillow can convert (1, L, LA, P, PA, RGBA, CMYK, YCbCr,
I, I;16, F, ...); a mode it cannot convert fails here as it fails there (a corrupt
sample). That includes Pillow's treatment of 16-bit and float images: values are clipped
to 0..255, not rescaled; a private rule here (policy 1 divided by 257 only when the image's
maximum was above 255, so a dark 16-bit image and a bright one of the same scene came out
on different scales) would give a model trained from the cache other inputs than the
same model evaluated on torchvision's loader. Decompression bombs follow Pillow too:
above ``Image.MAX_IMAGE_PIXELS`` Pillow only warns (``DecompressionBombWarning``) and the
image is decoded, as torchvision does (a 108 MP phone photo is a sample); above twice
that Pillow raises ``DecompressionBombError``, which is a corrupt sample here.

NOTE [decoder tag]
``DECODER_TAG`` names the pixels this module makes: the policy version above and the
Pillow release (its decoders and resampling may change between releases). It is part
of the L2 key namespace, so samples decoded by another policy or Pillow are never read
as ours; bump ``_POLICY`` with any change that alters pixels. A value read back must
also have a shape the policy can produce (:func:`possible_shape`): a checksummed
``(0, 0, 3)`` or ``(7, 9, 3)`` at ``cache_size`` 256 is a foreign value, not a sample.
"""
from __future__ import annotations

import io

import numpy as np
import PIL
from PIL import Image, UnidentifiedImageError

from cachepipe.errors import CorruptSampleError

__all__ = ["DECODER_TAG", "MAX_ASPECT", "decode_and_resize", "possible_shape", "resized_shape"]

MAX_ASPECT = 8
_POLICY = 2  # 2: NOTE [torchvision's pixels] (1 rescaled some 16-bit images)
DECODER_TAG = f"r{_POLICY}-pil{PIL.__version__}"


def possible_shape(shape: tuple[int, ...], cache_size: int) -> bool:
    """Whether the resize policy can produce an array of ``shape`` at ``cache_size``.

    The shorter side is ``cache_size`` and the longer at most ``MAX_ASPECT`` times it,
    or (capped panoramas) the longer side is exactly ``MAX_ASPECT * cache_size`` and the
    shorter one between 1 and ``cache_size - 1``; always 3 channels.

    Example:
        >>> possible_shape((256, 341, 3), 256), possible_shape((0, 0, 3), 256)
        (True, False)
    """
    if len(shape) != 3 or shape[2] != 3:
        return False
    short, long = sorted(shape[:2])
    cap = MAX_ASPECT * cache_size
    return (short == cache_size and long <= cap) or (long == cap and 1 <= short < cache_size)


def resized_shape(height: int, width: int, cache_size: int) -> tuple[int, int]:
    """Return ``(new_height, new_width)`` under the resize policy (see NOTE [resize policy]).

    Raises:
        ValueError: for a non-positive size.
    """
    if height < 1 or width < 1 or cache_size < 1:
        raise ValueError(f"sizes must be >= 1, got {height=}, {width=}, {cache_size=}")
    short, long = (height, width) if height <= width else (width, height)
    new_short, new_long = cache_size, int(cache_size * long / short)
    max_size = MAX_ASPECT * cache_size
    if new_long > max_size:
        new_short, new_long = max(1, int(max_size * new_short / new_long)), max_size
    return (new_short, new_long) if height <= width else (new_long, new_short)


def decode_and_resize(data: bytes, cache_size: int, *, index: int | None = None,
                      path: str | None = None) -> np.ndarray:
    """Decode an image file's bytes to RGB and resize its shorter side to ``cache_size``.

    The format is taken from the content, not the name, so PNG data in a ``.JPEG`` file
    decodes; every mode becomes RGB as torchvision's loader makes it (NOTE [torchvision's
    pixels]).

    Args:
        data: the whole file.
        cache_size: target length of the shorter side in pixels (see NOTE [resize policy]).
        index: sample index, only used in the error message.
        path: file path, only used in the error message.

    Returns:
        A C-contiguous, writable ``(H, W, 3)`` uint8 array.

    Raises:
        CorruptSampleError: the bytes are not a complete, decodable image.
        ValueError: ``cache_size < 1``.

    Example:
        >>> arr = decode_and_resize(open("cat.jpg", "rb").read(), 256)  # doctest: +SKIP
        >>> min(arr.shape[:2])  # doctest: +SKIP
        256
    """
    if cache_size < 1:
        raise ValueError(f"cache_size must be >= 1, got {cache_size}")
    try:
        with Image.open(io.BytesIO(data)) as img:  # NOTE [torchvision's pixels]
            img.load()
            rgb = img if img.mode == "RGB" else img.convert("RGB")  # convert would copy an RGB image
            h, w = rgb.height, rgb.width
            nh, nw = resized_shape(h, w, cache_size)
            if (nh, nw) != (h, w):
                rgb = rgb.resize((nw, nh), Image.Resampling.BILINEAR)
            out = np.array(rgb, dtype=np.uint8)
    except UnidentifiedImageError:
        raise CorruptSampleError(f"not an image ({len(data)} bytes)", index=index, path=path) from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, EOFError) as exc:
        raise CorruptSampleError(f"cannot decode ({type(exc).__name__}: {exc})",
                                 index=index, path=path) from None
    if out.ndim != 3 or out.shape[2] != 3:
        raise CorruptSampleError(f"decoded to shape {out.shape}, not (H, W, 3)", index=index, path=path)
    return out
