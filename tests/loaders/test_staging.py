"""The staging ring hands out a slot only after its last copy's fence; the device feed's values."""
from __future__ import annotations

import threading

import pytest
import torch

from loaders.device_feed import DeviceFeed, resolve_device
from loaders.staging import DONE, CudaFence, StagingRing


def reference(u8: torch.Tensor) -> torch.Tensor:
    """``(x / 255 - mean) / std`` in float64, written out (independent of the code under test)."""
    mean = torch.tensor([0.485, 0.456, 0.406], dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], dtype=torch.float64).view(1, 3, 1, 1)
    return ((u8.double() / 255 - mean) / std).float()


class HeldFence:
    """A fence the test completes: stands for a copy still in flight until ``complete()``."""

    def __init__(self) -> None:
        self._over = threading.Event()

    def complete(self) -> None:
        self._over.set()

    def done(self) -> bool:
        return self._over.is_set()

    def wait(self) -> None:
        self._over.wait()


def test_a_slot_whose_copy_is_in_flight_is_not_handed_out_until_its_fence_completes():
    ring = StagingRing(2)
    first, buf0 = ring.acquire((4, 3), torch.uint8)
    copy_in_flight = HeldFence()
    ring.release(first, copy_in_flight)
    second, _ = ring.acquire((4, 3), torch.uint8)
    ring.release(second, DONE)
    got = []
    t = threading.Thread(target=lambda: got.append(ring.acquire((4, 3), torch.uint8)))
    t.start()
    t.join(0.3)
    assert t.is_alive() and not got  # the ring came round to the slot the copy still reads
    copy_in_flight.complete()
    t.join(5)
    assert got and got[0][0] == first and got[0][1] is buf0  # the same buffer, once the copy is over
    assert ring.waits == 1 and ring.allocations == 2


def test_slots_are_allocated_once_per_shape_and_never_handed_out_twice():
    ring = StagingRing(3)
    seen = set()
    for _ in range(12):
        slot, buf = ring.acquire((2, 3, 4, 5), torch.uint8, torch.channels_last)
        assert buf.is_contiguous(memory_format=torch.channels_last)
        seen.add(buf.data_ptr())
        ring.release(slot, DONE)
    assert len(seen) == 3 and ring.allocations == 3 and ring.waits == 0
    slot, _ = ring.acquire((2, 3, 4, 5), torch.uint8)  # another layout: that slot is reallocated
    assert ring.allocations == 4
    for _ in range(len(ring) - 1):
        ring.release(*(ring.acquire((1,), torch.uint8)[0], DONE))
    with pytest.raises(RuntimeError, match="acquired and not released"):
        ring.acquire((1,), torch.uint8)  # came round to `slot`, which was never released
    with pytest.raises(ValueError, match=">= 1 slots"):
        StagingRing(0)


def _crops(seed: int, n: int = 4, size: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype,channels_last,tol", [(torch.float32, False, 1e-6), (torch.float32, True, 1e-6),
                                                     (torch.bfloat16, True, 2e-2), (torch.float16, False, 2e-3),
                                                     (torch.uint8, False, 0)])
def test_device_feed_on_cpu_equals_reference(dtype, channels_last, tol):
    feed = DeviceFeed(torch.device("cpu"), dtype, channels_last, mean=(0.485, 0.456, 0.406),
                      std=(0.229, 0.224, 0.225), slots=2)
    outs = [(feed(_crops(s)), s) for s in range(5)]
    for out, s in outs:  # earlier outputs are not overwritten by later batches through the same slots
        assert out.dtype == dtype
        assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        want = _crops(s) if dtype == torch.uint8 else reference(_crops(s))
        torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=tol)
    assert feed.ring.allocations == 2


class CopyFails(Exception):
    """Stands for an OOM or a Ctrl-C in the middle of a feed's copy."""


@pytest.mark.parametrize("where", ["copy", "convert"])
def test_an_exception_in_the_copy_gives_the_slot_back(monkeypatch, where):
    feed = DeviceFeed(torch.device("cpu"), torch.float32, True, mean=(0.485, 0.456, 0.406),
                      std=(0.229, 0.224, 0.225), slots=2)
    feed(_crops(0))
    real = feed._convert
    if where == "copy":  # a batch numpy cannot read: the copy into the slot raises
        bad = torch.empty((4, 3, 16, 16), dtype=torch.uint8, device="meta")
    else:
        bad = _crops(1)

        def failing(pixels):
            raise CopyFails("injected")
        monkeypatch.setattr(feed, "_convert", failing)
    with pytest.raises((CopyFails, TypeError, RuntimeError, NotImplementedError)):
        feed(bad)
    monkeypatch.setattr(feed, "_convert", real)
    for s in range(2, 6):  # every later batch comes round to the slot the failed one held
        torch.testing.assert_close(feed(_crops(s)), reference(_crops(s)), rtol=1e-6, atol=1e-6)


def test_device_argument_is_checked():
    assert resolve_device(None) is None
    with pytest.raises(ValueError, match="device='cpu'"):
        resolve_device("cpu")
    with pytest.raises(ValueError, match="device='gpu0'"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda': CUDA is not available"):
            resolve_device("cuda")


@pytest.mark.gpu
def test_cuda_ring_waits_for_the_copy_event_before_reusing_a_slot():
    ring = StagingRing(1, pin=True)
    stream = torch.cuda.Stream()
    slot, staged = ring.acquire((64, 1 << 20), torch.uint8)
    staged.fill_(7)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # keeps the copy below queued behind ~0.1 s of GPU time
        on_gpu = staged.to("cuda", non_blocking=True)
        fence = CudaFence(stream)
    ring.release(slot, fence)
    assert not fence.done()  # the copy has not run yet
    slot2, again = ring.acquire((64, 1 << 20), torch.uint8)
    assert slot2 == slot and fence.done() and ring.waits == 1  # acquire waited for the event
    again.fill_(9)  # safe now: the copy has read the slot
    torch.cuda.synchronize()
    assert int(on_gpu.min()) == 7 == int(on_gpu.max())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_feed_never_overwrites_a_batch_in_flight(dtype):
    feed = DeviceFeed(resolve_device("cuda"), dtype, True, mean=(0.485, 0.456, 0.406),
                      std=(0.229, 0.224, 0.225), slots=2)
    outs = []
    for s in range(12):  # more batches than slots; each copy queued behind GPU work on the feed's stream
        with torch.cuda.stream(feed.stream):
            torch.cuda._sleep(20_000_000)
        outs.append(feed(_crops(s, n=32, size=64)))
    torch.cuda.synchronize()
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    for s, out in enumerate(outs):
        assert out.is_cuda and out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(out.float().cpu(), reference(_crops(s, n=32, size=64)), rtol=tol, atol=tol)
    assert feed.ring.allocations == 2 and feed.ring.waits > 0
