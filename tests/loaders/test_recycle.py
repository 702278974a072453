"""RecyclingNormalizer reuses a float buffer only when nothing else can see it."""
from __future__ import annotations

import pytest
import torch

from loaders.recycle import RecyclingNormalizer
from loaders.transforms import normalize


def batch(seed=0):
    return torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_values_match_normalize_and_a_dropped_batch_is_reused():
    n = RecyclingNormalizer()
    out = n(batch())
    torch.testing.assert_close(out, normalize(batch()))
    ptr = out.data_ptr()
    del out
    again = n(batch(1))
    assert again.data_ptr() == ptr and n.reused == 1
    torch.testing.assert_close(again, normalize(batch(1)))


def test_batches_still_referenced_anywhere_are_never_overwritten():
    n = RecyclingNormalizer(keep=8)
    kept = n(batch(0))  # held by the user
    saved = n(batch(1))  # saved by autograd for backward
    weight = torch.randn(4, 3, 3, 3, requires_grad=True)
    loss = torch.nn.functional.conv2d(saved, weight).sum()
    saved_ptr = saved.data_ptr()
    del saved
    viewed = n(batch(2))
    view = viewed[1]  # only a view survives
    viewed_ptr = viewed.data_ptr()
    del viewed
    fresh = [n(batch(3 + k)) for k in range(3)]
    assert n.reused == 0
    assert {f.data_ptr() for f in fresh}.isdisjoint({kept.data_ptr(), saved_ptr, viewed_ptr})
    torch.testing.assert_close(kept, normalize(batch(0)))
    torch.testing.assert_close(view, normalize(batch(2))[1])
    loss.backward()  # the saved input was intact
    torch.testing.assert_close(weight.grad, torch.autograd.grad(
        torch.nn.functional.conv2d(normalize(batch(1)), weight).sum(), weight)[0])


def test_channels_last_and_half_outputs():
    x = RecyclingNormalizer(torch.float16, channels_last=True)(batch())
    assert x.dtype == torch.float16 and x.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(x.float(), normalize(batch()), rtol=1e-3, atol=1e-2)


def test_raw_uint8_mode_copies_pixels_into_the_requested_layout():
    src = torch.randint(0, 256, (2, 3, 5, 7), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    out = RecyclingNormalizer(torch.uint8, normalize=False)(src)
    assert out.dtype == torch.uint8 and out.is_contiguous() and torch.equal(out, src)
    with pytest.raises(ValueError, match="uint8"):
        RecyclingNormalizer(torch.float32, normalize=False)
