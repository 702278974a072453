"""uint8 batches to the device through the staging ring, normalised there.

NOTE [uint8 to the device]: with ``device="cuda"`` the workers ship raw uint8 crops
(channels-last, a quarter of float32's bytes) in recycled shared memory. The training
thread copies each into the next pinned slot of the loader's ``StagingRing`` (a memcpy; the
worker's buffer goes straight back to it), enqueues the copy to the GPU on a side stream,
records the slot's fence (a CUDA event) right after it, and on the same stream turns the
uint8 pixels into the normalised ``dtype`` batch in the layout asked for with one kernel
(NOTE [one pass normalisation]). The training stream waits for the side stream before it
uses the batch, so the host never blocks on the GPU except when the ring comes round to a
slot whose copy is still in flight (NOTE [staging ring]); torch's pin-memory thread is not
used. On a CPU device (tests, the CPU proxy) the same path runs with plain memory and
synchronous copies.
"""
from __future__ import annotations

import numpy as np
import torch

from loaders.affine import ChannelAffine
from loaders.staging import DONE, CudaFence, Fence, StagingRing

__all__ = ["DeviceFeed", "resolve_device"]


def resolve_device(device) -> torch.device | None:
    """``None`` (CPU batches from the workers) or the CUDA device batches are delivered on.

    Raises:
        ValueError: not ``None``/``"cuda"``/``"cuda:N"``/a CUDA ``torch.device``, or CUDA is
            not available (names the argument).
    """
    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r}: expected None or 'cuda' (or 'cuda:N')") from None
    if resolved.type != "cuda":
        raise ValueError(f"device={device!r}: expected None (CPU batches) or 'cuda' (or 'cuda:N')")
    if not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: CUDA is not available here (torch {torch.__version__}); "
                         f"pass device=None for CPU batches")
    return torch.device("cuda", torch.cuda.current_device() if resolved.index is None else resolved.index)


class DeviceFeed:
    """Turns the workers' uint8 channels-last batches into batches on ``device`` (NOTE above).

    Args:
        device: where batches are delivered (CUDA; a CPU device runs the same path with
            plain memory).
        dtype: output dtype: float32/float16/bfloat16 (normalised) or uint8 (raw pixels).
        channels_last: output memory format.
        mean, std: normalisation statistics (ignored for uint8).
        slots: staging ring size (the loader's prefetch + 2).
    """

    def __init__(self, device: torch.device, dtype: torch.dtype, channels_last: bool, *, mean, std,
                 slots: int) -> None:
        self.device, self.dtype = device, dtype
        self.cuda = device.type == "cuda"
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.affine = None if dtype == torch.uint8 else ChannelAffine(mean, std)
        self.ring = StagingRing(slots, pin=self.cuda)
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """The batch of ``images`` (uint8 NCHW, CPU) on the device; ``images`` may be reused after."""
        slot, staged = self.ring.acquire(images.shape, torch.uint8, torch.channels_last)
        fence = DONE
        try:  # NOTE [a slot is always released]
            np.copyto(staged.numpy(), images.numpy())  # one thread, whatever torch's intra-op pool is
            if not self.cuda:
                return self._convert(staged.clone() if self.affine is None else staged)
            with torch.cuda.stream(self.stream):
                fence = None  # from here a copy may be in flight: the fence is the stream's event
                pixels = staged.to(self.device, non_blocking=True)
                fence = CudaFence(self.stream)
                out = self._convert(pixels)
        finally:
            self.ring.release(slot, self._fence_after_failure() if fence is None else fence)
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        out.record_stream(current)  # the allocator must not hand its memory out while the model reads it
        return out

    def _fence_after_failure(self) -> Fence:
        """The fence of a slot whose copy failed midway: the side stream's work so far, if CUDA can say.

        NOTE [a slot is always released]: an exception between ``acquire`` and ``release`` (an
        OOM, a Ctrl-C in the copy) would leave the slot acquired for good, and every later batch
        would fail when the ring came round to it. So the slot is released in ``finally``; when
        the copy may have been enqueued, with an event recorded after it, so that the slot is
        written again only once that copy is over.
        """
        try:
            return CudaFence(self.stream)
        except Exception:  # CUDA itself failed (a lost device): nothing more can be enqueued after it
            return DONE

    def _convert(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels on the device -> the output batch (one kernel on CUDA)."""
        if self.affine is None:
            return pixels.contiguous(memory_format=self.memory_format)
        out = torch.empty(pixels.shape, dtype=self.dtype, device=pixels.device, memory_format=self.memory_format)
        return self.affine.into(out, pixels)
