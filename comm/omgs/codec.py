"""Error-feedback top-k compression of one flat group and its (values, indices) wire format.

NOTE [OMGS wire format]
One worker's contribution for a group of ``n`` elements is ONE float32 tensor of length
``2k``: ``k`` values, then ``k`` int32 indices bit-cast to float32 (so a single
all-gather moves both; ``BYTES_PER_SELECTED = 8``). ``k = selected_count(n, rho)`` is the
same on every rank, as all-gather needs; a selector that returns fewer entries is padded
with (value 0, index 0), which adds nothing. int32 indices limit a group to 2**31 - 1
elements.
"""
from __future__ import annotations

import torch

__all__ = ["compress", "pack", "unpack_add"]


def pack(values: torch.Tensor, indices: torch.Tensor, k: int) -> torch.Tensor:
    """Pack ``k`` values and indices into one float32 tensor (NOTE [OMGS wire format])."""
    values = values.reshape(-1)[:k].to(torch.float32)
    indices = indices.reshape(-1)[:k].to(torch.int32)
    if values.numel() < k:
        pad = k - values.numel()
        values = torch.cat([values, values.new_zeros(pad)])
        indices = torch.cat([indices, indices.new_zeros(pad)])
    return torch.cat([values, indices.view(torch.float32)])


def unpack_add(out: torch.Tensor, packed: torch.Tensor, k: int) -> None:
    """Scatter-add one worker's packed contribution into the flat tensor ``out``."""
    values = packed[:k]
    indices = packed[k:2 * k].view(torch.int32).to(torch.int64)
    out.index_add_(0, indices, values.to(out.dtype))


def compress(acc: torch.Tensor, k: int, selector, error_feedback: bool = True) -> torch.Tensor:
    """Select ``k`` entries of the flat accumulator ``acc`` and return them packed.

    With error feedback ``acc`` (already holding residual + gradient) keeps what was not
    sent: the selected entries are zeroed in place, so ``acc`` becomes the new residual.
    Without it, ``acc`` is zeroed (it is only a scratch buffer then).
    """
    values, indices = selector(acc, k)
    packed = pack(values, indices, k)  # a copy: safe to modify acc afterwards
    if error_feedback:
        acc.index_fill_(0, indices.to(torch.int64).reshape(-1)[:k], 0.0)
    else:
        acc.zero_()
    return packed
