"""Workers' shared batches: handed to the user without a copy, recycled once dropped, never while
referenced; the outputs equal the normalised pixels; recycling survives the staging (pinned) path."""
from __future__ import annotations

import zlib

import pytest
import torch

from loaders import cached_dataloader
from loaders.dataloader import CachedDataLoader

KW = dict(batch_size=4, train=True, size=32, cache_size=40, workers=2, seed=5)


def reference(u8: torch.Tensor) -> torch.Tensor:
    """``(x / 255 - mean) / std`` in float64, written out (independent of the code under test)."""
    mean = torch.tensor([0.485, 0.456, 0.406], dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], dtype=torch.float64).view(1, 3, 1, 1)
    return ((u8.double() / 255 - mean) / std).float()


def _epochs(loader, n):
    for epoch in range(n):
        loader.set_epoch(epoch)
        yield from loader


def test_dropped_batches_go_back_to_their_worker(source, cache_dir):
    loader = cached_dataloader(source, cache_dir=cache_dir, **KW)
    try:
        batches = 0
        for images, _ in _epochs(loader, 8):  # held as a training loop holds them
            assert images.untyped_storage().is_shared()  # the worker's buffer itself: no copy
            batches += 1
        # at most prefetch 2 + the batch in hand + the one being made, per worker, for 48 batches
        assert batches == 48 and len(loader.shared_allocations) == 2
        assert max(loader.shared_allocations.values()) <= 4
        assert loader.handed_out.released >= 40
    finally:
        loader.close()


def test_batches_still_referenced_anywhere_are_never_overwritten(source, cache_dir):
    loader = cached_dataloader(source, cache_dir=cache_dir, **KW)
    try:
        batches = _epochs(loader, 8)
        kept, _ = next(batches)  # held by the user
        saved, _ = next(batches)  # saved by autograd for backward
        weight = torch.randn(4, 3, 3, 3, requires_grad=True)
        loss = torch.nn.functional.conv2d(saved, weight).sum()
        viewed, _ = next(batches)
        view = viewed[1]  # only a view survives
        stored, _ = next(batches)
        storage = stored.untyped_storage()  # only its storage survives
        copies = {name: t.clone() for name, t in
                  dict(kept=kept, saved=saved, view=view, storage=stored).items()}
        expected_grad = torch.autograd.grad(torch.nn.functional.conv2d(copies["saved"], weight).sum(), weight)[0]
        del saved, viewed, stored
        for _ in batches:  # 40-odd batches more, through the same few buffers
            pass
        torch.testing.assert_close(kept, copies["kept"], rtol=0, atol=0)
        torch.testing.assert_close(view, copies["view"], rtol=0, atol=0)
        again = torch.empty(0).set_(storage, 0, copies["storage"].shape, copies["storage"].stride())
        torch.testing.assert_close(again, copies["storage"], rtol=0, atol=0)
        loss.backward()  # the saved input was intact
        torch.testing.assert_close(weight.grad, expected_grad)
    finally:
        loader.close()


@pytest.mark.parametrize("dtype,channels_last,tol", [("float32", False, 1e-6), ("float32", True, 1e-6),
                                                     ("bfloat16", True, 2e-2)])
def test_outputs_equal_the_normalised_uint8_pixels(source, cache_dir, dtype, channels_last, tol):
    raw = cached_dataloader(source, cache_dir=cache_dir, dtype="uint8", normalize=False, **KW)
    out = cached_dataloader(source, cache_dir=cache_dir, dtype=dtype, channels_last=channels_last, **KW)
    try:
        for (u8, ya), (x, yb) in zip(_epochs(raw, 2), _epochs(out, 2)):
            assert u8.dtype == torch.uint8 and u8.is_contiguous() and torch.equal(ya, yb)
            assert x.dtype == getattr(torch, dtype)
            assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
            torch.testing.assert_close(x.float(), reference(u8), rtol=tol, atol=tol)
    finally:
        raw.close()
        out.close()


def test_recycling_survives_the_staging_path(source, cache_dir):
    """The staging ring (pinned on a GPU, plain memory here) copies each batch out of the worker's
    buffer, which then goes straight back: neither side allocates per batch."""
    reference = cached_dataloader(source, cache_dir=cache_dir, dtype="bfloat16", channels_last=True, **KW)
    staged = CachedDataLoader(reference.dataset, reference.transform, reference.sampler, workers=2,
                              prefetch_factor=2, device=torch.device("cpu"))
    try:
        assert staged.transform.dtype == "uint8" and staged.feed.ring.pin is False
        outs = [(x, y) for x, y in _epochs(staged, 6)]
        assert max(staged.shared_allocations.values()) <= 4  # 36 batches: the workers' buffers came back
        assert staged.feed.ring.allocations == len(staged.feed.ring) == 4
        reference.set_epoch(5)
        for (x, y), (want, wy) in zip(outs[-len(reference):], reference, strict=True):
            assert torch.equal(y, wy) and x.dtype == torch.bfloat16
            assert x.is_contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(x, want, rtol=0, atol=0)
    finally:
        staged.close()
        reference.close()


def _crc(t: torch.Tensor) -> int:
    return zlib.crc32(t.contiguous().view(torch.uint8).numpy().tobytes())


def _receiver(batches, sums) -> None:
    """Another process that keeps every batch it is sent (an async logger, a prefetching consumer)."""
    held = []
    while (item := batches.get()) is not None:
        images, sent = item
        held.append((images, sent, _crc(images)))
    sums.put([(sent, at_receipt, _crc(images)) for images, sent, at_receipt in held])


@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_batches_sent_to_another_process_are_never_overwritten(source, cache_dir, strategy):
    """Issue 46, defect 5: a batch put on a torch.multiprocessing queue was recycled once dropped
    here, and the worker's next batch changed it under its receiver."""
    from trainer.launch import rank_context

    old = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy(strategy)
    ctx = rank_context()
    batches, sums = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=_receiver, args=(batches, sums))
    receiver.start()
    loader = cached_dataloader(source, cache_dir=cache_dir, dtype="uint8", normalize=False, **KW)
    try:
        sent = 0
        for images, _ in _epochs(loader, 4):
            batches.put((images, _crc(images)))  # then dropped here: only the receiver holds it
            sent += 1
        batches.put(None)
        rows = sums.get(timeout=60)
        receiver.join(30)
        assert len(rows) == sent == 24
        assert [r for r in rows if not r[0] == r[1] == r[2]] == []  # intact at receipt and after the epochs
        assert loader.handed_out.released == 0 and loader.handed_out.forgotten >= 20  # the last ones still tracked
    finally:
        loader.close()
        torch.multiprocessing.set_sharing_strategy(old)
        if receiver.is_alive():
            receiver.kill()


def test_bad_dtype_and_device_name_the_argument(source, cache_dir):
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        cached_dataloader(source, cache_dir=cache_dir, dtype="float8", **KW)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda': CUDA is not available"):
            cached_dataloader(source, cache_dir=cache_dir, device="cuda", **KW)
