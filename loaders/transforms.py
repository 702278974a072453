"""Train and validation transforms on cached uint8 HWC samples, in torch (no torchvision).

Each transform works on one sample (``transform(sample) -> CHW``, for
``CachedImageFolder(transform=...)``) or on a whole batch
(``transform.batch(samples, rng, size) -> NCHW``, used by ``cached_dataloader``).

NOTE [fast resized crop]: crop first (a view), then resize only the crop with
``F.interpolate(mode="bilinear", antialias=True)`` on uint8 in channels-last layout,
which runs torch's vectorised uint8 kernel; the flip is fused into the crop's copy and the
normalisation into the copy into the output batch (NOTE [one pass normalisation]). This is what makes the cached loader several times
faster than decoding files: no full-image float conversion ever happens.
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from loaders.affine import IMAGENET_MEAN, IMAGENET_STD, ChannelAffine
from loaders.crop import (DEFAULT_RATIO, DEFAULT_SCALE, VAL_RESIZE_FRACTION, CropWindow, center_crop_window,
                          random_resized_crop_window, resize_shorter_dims)

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "TrainTransform", "ValTransform", "make_transform", "normalize",
           "resized_crop"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "uint8": torch.uint8}


def _as_hwc(sample):
    """Check a uint8 HWC sample (numpy array or tensor) without copying it (it may be read-only)."""
    if not isinstance(sample, torch.Tensor):
        sample = np.asarray(sample)
    if sample.dtype not in (torch.uint8, np.uint8) or sample.ndim != 3 or sample.shape[2] != 3:
        raise ValueError(f"expected a uint8 HWC sample with 3 channels; got {tuple(sample.shape)} {sample.dtype}")
    return sample


def _crop_copy(img, win: CropWindow, flip: bool) -> torch.Tensor:
    """The window of a uint8 HWC sample as a new contiguous HWC tensor, flipped on the way.

    Only the window is copied, so a read-only numpy view of a Redis reply can be used directly.
    """
    crop = img[win.top:win.top + win.height, win.left:win.left + win.width]
    if not isinstance(crop, torch.Tensor):
        if not flip:
            return torch.from_numpy(crop.copy())  # a C-order, writable copy of the window only
        crop = torch.from_numpy(crop.copy())  # numpy's flipped copy moves 3-byte items one by one: 10x slower
    return crop.flip(1) if flip else crop.contiguous()


def resized_crop(img, win: CropWindow, out_h: int, out_w: int, flip: bool = False) -> torch.Tensor:
    """uint8 HWC -> uint8 1x3xHxW (channels-last memory); see NOTE [fast resized crop].

    The flip is applied to the crop (the copy that makes it contiguous anyway); bilinear
    resampling with half-pixel centres is mirror-symmetric, so this equals flipping after.
    """
    # NOTE [channels-last view]: unsqueeze before permuting. ``permute(2, 0, 1).unsqueeze(0)``
    # gives the batch dim stride 3, which torch does not recognise as channels-last, and
    # interpolate then takes its generic kernel: half the speed of the AVX2 uint8 one.
    x = _crop_copy(img, win, flip).unsqueeze(0).permute(0, 3, 1, 2)
    if (win.height, win.width) == (out_h, out_w):
        return x
    return F.interpolate(x, size=(out_h, out_w), mode="bilinear", antialias=True, align_corners=False)


def normalize(images: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype=torch.float32) -> torch.Tensor:
    """uint8 NCHW (or CHW) in [0, 255] -> ``(x / 255 - mean) / std`` as ``dtype``, on its device.

    The output keeps the input's memory layout; on a GPU it is one kernel (NOTE [one pass
    normalisation]). ``cached_dataloader(device="cuda")`` does this for you.

    Example:
        >>> normalize(torch.zeros(1, 3, 2, 2, dtype=torch.uint8))[0, :, 0, 0]
        tensor([-2.1179, -2.0357, -1.8044])
    """
    batch = images if images.ndim == 4 else images.unsqueeze(0)
    out = torch.empty_like(batch, dtype=dtype, memory_format=torch.preserve_format)
    ChannelAffine(mean, std).into(out, batch)
    return out if images.ndim == 4 else out[0]


@dataclass(frozen=True)
class _Base:
    """Fields and batch machinery shared by the train and validation transforms."""

    size: int = 224
    normalize: bool = True
    dtype: str = "float32"
    channels_last: bool = False
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; valid: {sorted(_DTYPES)}")
        if self.dtype == "uint8" and self.normalize:
            raise ValueError("dtype='uint8' returns raw pixels: pass normalize=False (normalise later on the GPU)")
        if not self.normalize and self.dtype != "uint8":
            raise ValueError(f"normalize=False returns raw uint8 pixels; pass dtype='uint8' (got {self.dtype!r})")

    def _one(self, img: torch.Tensor, size: int, rng: random.Random) -> torch.Tensor:
        """uint8 HWC -> uint8 1x3x``size``x``size`` (subclasses)."""
        raise NotImplementedError

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    # -- shared machinery -----------------------------------------------------------------
    @functools.cached_property
    def _affine(self) -> ChannelAffine | None:
        return ChannelAffine(self.mean, self.std) if self.normalize else None

    def new_batch(self, n: int, size: int) -> torch.Tensor:
        """An empty NCHW output batch in this transform's dtype and memory format."""
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        return torch.empty((n, 3, size, size), dtype=self.torch_dtype, memory_format=fmt)

    def write(self, dst: torch.Tensor, src_u8: torch.Tensor, affine: ChannelAffine | None) -> None:
        """Copy one 1x3xHxW uint8 result into ``dst`` (3xHxW), normalising on the way."""
        if affine is None:
            dst.copy_(src_u8[0])
        else:
            affine.write(dst, src_u8[0])

    def __call__(self, sample, rng: random.Random | None = None, size: int | None = None) -> torch.Tensor:
        """One uint8 HWC sample (numpy or tensor) -> CHW tensor.

        ``rng`` defaults to Python's global ``random`` (seeded per DataLoader worker).
        """
        return self.batch([sample], rng, size)[0]

    def batch(self, samples, rng: random.Random | None = None, size: int | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 HWC samples of any sizes -> one NCHW batch (``size`` overrides ``self.size``).

        Args:
            samples: sequence of uint8 HWC arrays (read-only views are fine) or tensors.
            rng: random source for crops and flips (default: the global ``random``).
            size: output side; progressive resizing passes a new one per epoch.
            out: optional preallocated output (e.g. in shared memory).
        """
        size = self.size if size is None else int(size)
        rng = random if rng is None else rng
        out = self.new_batch(len(samples), size) if out is None else out
        affine = self._affine
        for n, sample in enumerate(samples):
            self.write(out[n], self._one(_as_hwc(sample), size, rng), affine)
        return out


@dataclass(frozen=True)
class TrainTransform(_Base):
    """Random-resized-crop + horizontal flip + normalise (torchvision's training recipe).

    Args:
        size: output side in pixels (default 224).
        scale: area fraction range of the crop (default (0.08, 1.0)).
        ratio: aspect ratio range (default (3/4, 4/3)).
        flip_prob: probability of a horizontal flip (default 0.5).
        normalize: subtract ImageNet mean / divide by std (default True); False returns uint8.
        dtype: "float32" (default), "float16", "bfloat16", or "uint8" with normalize=False.
        channels_last: return NHWC memory layout (shape stays NCHW).

    Example:
        >>> t = TrainTransform(size=32)
        >>> t(np.zeros((40, 50, 3), np.uint8), random.Random(0)).shape
        torch.Size([3, 32, 32])
    """

    scale: tuple[float, float] = DEFAULT_SCALE
    ratio: tuple[float, float] = DEFAULT_RATIO
    flip_prob: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (0 < self.scale[0] <= self.scale[1] <= 1) or not (0 < self.ratio[0] <= self.ratio[1]):
            raise ValueError(f"need 0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= ratio[1]; "
                             f"got scale={self.scale}, ratio={self.ratio}")
        if not 0 <= self.flip_prob <= 1:
            raise ValueError(f"flip_prob must be in [0, 1], got {self.flip_prob}")

    def plan(self, height: int, width: int, rng: random.Random) -> tuple[CropWindow, bool]:
        """Draw (crop window, flip?) for one ``height x width`` sample; the DALI path uses it too."""
        win = random_resized_crop_window(height, width, rng, self.scale, self.ratio)
        return win, rng.random() < self.flip_prob

    def _one(self, img, size, rng):
        win, flip = self.plan(img.shape[0], img.shape[1], rng)
        return resized_crop(img, win, size, size, flip)


@dataclass(frozen=True)
class ValTransform(_Base):
    """Resize the shorter side to ``round(size / 0.875)``, center-crop ``size``, normalise.

    Args: as ``TrainTransform`` (no scale/ratio/flip). The resize is skipped when the
    sample already has that shorter side (cached at 256 and size 224: a pure crop).
    """

    def resize_to(self, height: int, width: int, size: int) -> tuple[int, int]:
        return resize_shorter_dims(height, width, int(round(size / VAL_RESIZE_FRACTION)))

    def _one(self, img, size, rng):
        rh, rw = self.resize_to(img.shape[0], img.shape[1], size)
        resized = resized_crop(img, CropWindow(0, 0, img.shape[0], img.shape[1]), rh, rw)
        c = center_crop_window(rh, rw, size)
        return resized[:, :, c.top:c.top + size, c.left:c.left + size]


def make_transform(train: bool, size: int, **kwargs) -> _Base:
    """``TrainTransform(size, **kwargs)`` if ``train`` else ``ValTransform(size, **kwargs)``."""
    return TrainTransform(size=size, **kwargs) if train else ValTransform(size=size, **kwargs)
