"""Per-channel normalisation ``(x / 255 - mean) / std`` = ``x * scale + bias``, fused and vectorised.

NOTE [one pass normalisation]: on a GPU, ``torch.addcmul(bias, u8, scale, out=out)``
is one elementwise kernel that reads the uint8 pixels, converts, scales, shifts, casts
to ``out``'s dtype and writes ``out``'s layout (channels-last or not): one pass over the
batch, no temporaries. On CPU, torch converts mixed-dtype inputs into temporaries first,
and a ``(3, 1, 1)`` scale over channels-last data makes the innermost loop 3 elements
long, which is not vectorised (0.26 ms per 224 px image single-threaded, 2-3x the cost of
the bytes it writes). So on CPU the float image is first filled by a converting copy and
then scaled in place by a row that repeats the three channels' factors along the width
(``W x 3`` contiguous values): the inner loop runs over a whole row of pixels.
"""
from __future__ import annotations

import torch

__all__ = ["ChannelAffine", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _is_hwc(image: torch.Tensor) -> bool:
    """Whether a ``3 x H x W`` image is channels-last in memory (rows of ``W x 3`` values)."""
    return image.permute(1, 2, 0).is_contiguous()


class ChannelAffine:
    """``x * scale + bias`` per channel, with ``scale = 1 / (255 std)`` and ``bias = -mean / std``.

    Args:
        mean, std: per-channel statistics of pixels in [0, 1] (default ImageNet's).

    Example:
        >>> a = ChannelAffine()
        >>> out = torch.empty(1, 3, 2, 2)
        >>> a.into(out, torch.zeros(1, 3, 2, 2, dtype=torch.uint8))[0, :, 0, 0]
        tensor([-2.1179, -2.0357, -1.8044])
    """

    def __init__(self, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> None:
        self.scale = torch.tensor([1.0 / (255.0 * s) for s in std], dtype=torch.float32)
        self.bias = torch.tensor([-m / s for m, s in zip(mean, std)], dtype=torch.float32)
        self._rows: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
        self._columns: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._image: torch.Tensor | None = None  # scratch of write()

    def _column(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, bias)`` shaped ``(3, 1, 1)`` on ``device``."""
        if device not in self._columns:
            self._columns[device] = (self.scale.view(3, 1, 1).to(device), self.bias.view(3, 1, 1).to(device))
        return self._columns[device]

    def _row(self, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, bias)`` repeated ``width`` times: ``W x 3`` contiguous values."""
        key = (width, device)
        if key not in self._rows:
            self._rows[key] = (self.scale.repeat(width).to(device), self.bias.repeat(width).to(device))
        return self._rows[key]

    def apply_(self, image: torch.Tensor) -> torch.Tensor:
        """Normalise one float32 ``3 x H x W`` image in place (either memory layout); returns it."""
        if _is_hwc(image):  # channels-last: one W x 3 row per image row
            rows = image.permute(1, 2, 0).view(image.shape[1], -1)
            scale, bias = self._row(image.shape[2], image.device)
            torch.addcmul(bias, rows, scale, out=rows)
        else:  # CHW: the innermost loop already runs along a row of one channel
            scale, bias = self._column(image.device)
            torch.addcmul(bias, image, scale, out=image)
        return image

    def write(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst`` (float ``3 x H x W``, any layout) = normalised ``src`` (uint8 ``3 x H x W``), CPU.

        Channels-last pixels are converted and scaled in their own layout (a float32 image
        in place, else a reused scratch image), then copied into ``dst`` (changing layout or
        dtype in that copy): 1.6x faster than converting straight into a CHW ``dst``.
        """
        if _is_hwc(src) and not (dst.dtype == torch.float32 and _is_hwc(dst)):
            scratch = self._scratch(src.shape[1], src.shape[2])
            scratch.copy_(src)
            dst.copy_(self.apply_(scratch))
        elif dst.dtype == torch.float32:
            dst.copy_(src)  # converts, and changes the layout, in one pass
            self.apply_(dst)
        else:
            dst.copy_(self.apply_(src.to(torch.float32)))

    def _scratch(self, height: int, width: int) -> torch.Tensor:
        """A float32 channels-last ``3 x height x width`` image, kept for the next one."""
        if self._image is None or self._image.shape[1:] != (height, width):
            self._image = torch.empty(height, width, 3).permute(2, 0, 1)
        return self._image

    def into(self, out: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """``out`` (float NCHW, any layout and float dtype) = normalised ``images`` (uint8 NCHW).

        On CUDA one fused kernel (NOTE [one pass normalisation]); on CPU image by image.
        """
        if out.device.type == "cuda":
            scale, bias = self._column(out.device)
            return torch.addcmul(bias, images, scale, out=out)
        for n in range(len(images)):  # one image at a time stays in the CPU cache
            self.write(out[n], images[n])
        return out
