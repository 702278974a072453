"""Normalise uint8 batches into recycled float buffers in the consuming process.

NOTE [uint8 between processes]: DataLoader workers ship uint8 batches (4x fewer bytes
through shared memory than float32) and the loader's iterator normalises them into float
in the training process. Each fresh 38 MB float batch costs thousands of page faults (the
kernel zero-fills every new page; in a VM each first touch also exits to the host), which
on small machines costs more than the arithmetic. So output buffers are recycled, but only
when nothing outside the pool still refers to one: its Python reference count, the C++
reference count of its tensor (autograd's saved tensors hold those) and the reference count
of its storage (views) are all what they were when the buffer was fresh. A batch the user
keeps (in a list, saved by autograd for backward, as a view) is therefore never
overwritten; the pool allocates a new buffer instead.
"""
from __future__ import annotations

import sys

import torch

from loaders.transforms import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["RecyclingNormalizer"]


def _refs(t: torch.Tensor) -> tuple[int, int, int]:
    """(Python refs, C++ tensor refs, storage refs) of ``t``."""
    return sys.getrefcount(t), t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _idle_refs() -> tuple[int, int, int]:
    """``_refs`` of a tensor held only by a list, seen from a loop over that list (as in ``_buffer``)."""
    pool = [torch.empty(1)]
    for buf in pool:
        return _refs(buf)


class RecyclingNormalizer:
    """``(x / 255 - mean) / std`` of uint8 NCHW batches into float buffers reused when free.

    Args:
        dtype: output dtype (float32, float16, bfloat16).
        channels_last: output memory format.
        mean, std: per-channel statistics (default ImageNet's).
        keep: most buffers kept for reuse (default 4).
        pin_memory: allocate page-locked buffers (fast, asynchronous copies to a GPU).
        normalize: False copies the uint8 pixels as they are (only the memory format may
            change; ``dtype`` must then be uint8): the recycled-buffer transport without the
            arithmetic, for loaders that return raw uint8.
    """

    def __init__(self, dtype: torch.dtype = torch.float32, channels_last: bool = False, *,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, keep: int = 4, pin_memory: bool = False,
                 normalize: bool = True) -> None:
        if not normalize and dtype != torch.uint8:
            raise ValueError(f"normalize=False copies raw pixels: dtype must be torch.uint8, got {dtype}")
        self.dtype = dtype
        self.normalize = normalize
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.scale = torch.tensor([1.0 / (255.0 * s) for s in std]).view(1, 3, 1, 1)
        self.bias = torch.tensor([-m / s for m, s in zip(mean, std)]).view(1, 3, 1, 1)
        self.keep = keep
        self.pin_memory = pin_memory
        self._pool: list[torch.Tensor] = []
        self._idle = _idle_refs()
        self.reused = 0

    def _buffer(self, shape: torch.Size) -> torch.Tensor:
        for buf in self._pool:  # counted from a loop variable, like _idle_refs
            if buf.shape == shape and _refs(buf) == self._idle:
                self.reused += 1
                return buf
        if len(self._pool) >= self.keep:
            self._pool.pop(0)
        buf = torch.empty(shape, dtype=self.dtype, memory_format=self.memory_format, pin_memory=self.pin_memory)
        self._pool.append(buf)
        return buf

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 NCHW -> normalised ``dtype`` NCHW (a pooled buffer; see NOTE above)."""
        out = self._buffer(images.shape)
        if not self.normalize:
            out.copy_(images)
            return out
        scale, bias = self.scale[0], self.bias[0]
        for n in range(len(images)):  # one sample at a time stays in the CPU cache
            if self.dtype == torch.float32:
                out[n].copy_(images[n])
                out[n].mul_(scale).add_(bias)
            else:
                out[n].copy_(images[n].float().mul_(scale).add_(bias))
        return out
