"""Values and indices of a sparse exchange packed in one tensor, so that one collective
carries both, and read back in place (NOTE [exchange working memory] in
comm/collectives/base.py)."""
from __future__ import annotations

import torch

__all__ = ["index_dtype", "pair_layout", "pair_bytes", "pack_pairs", "split_pairs", "add_pairs_", "remove_sent_"]


def index_dtype(numel: int) -> torch.dtype:
    """int32 indices on the wire when they fit (half the bytes of int64)."""
    return torch.int32 if numel < 2**31 else torch.int64


def pair_layout(k: int, value_dtype: torch.dtype, idx_dtype: torch.dtype) -> tuple[int, int]:
    """``(index_offset, row_bytes)`` of ``k`` packed pairs: values at byte 0, indices at the
    next multiple of their size, the row padded to 8 bytes, so that every row of a gathered
    tensor views as both dtypes in place."""
    at = -(-k * value_dtype.itemsize // idx_dtype.itemsize) * idx_dtype.itemsize
    return at, -(-(at + k * idx_dtype.itemsize) // 8) * 8


def pack_pairs(values: torch.Tensor, indices: torch.Tensor, value_dtype: torch.dtype,
               idx_dtype: torch.dtype) -> torch.Tensor:
    """``values`` as ``value_dtype`` and ``indices`` as ``idx_dtype``, written straight into the
    bytes of one new tensor (:func:`pair_layout`; one all-gather carries both; NOTE [exchange
    working memory])."""
    k = values.numel()
    pairs = torch.empty(pair_layout(k, value_dtype, idx_dtype)[1], dtype=torch.uint8, device=values.device)
    sent, idx = split_pairs(pairs, k, value_dtype, idx_dtype)
    sent.copy_(values)
    idx.copy_(indices)
    return pairs


def split_pairs(row: torch.Tensor, k: int, value_dtype: torch.dtype,
                idx_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The values and indices of one row of :func:`pack_pairs` bytes, as views."""
    at = pair_layout(k, value_dtype, idx_dtype)[0]
    return row[:k * value_dtype.itemsize].view(value_dtype), row[at:at + k * idx_dtype.itemsize].view(idx_dtype)


def add_pairs_(out: torch.Tensor, gathered: torch.Tensor, k: int, value_dtype: torch.dtype, idx_dtype: torch.dtype,
               scale: float, offsets: list[int] | None = None) -> torch.Tensor:
    """Scatter-add into ``out`` the ``k`` pairs of every row of gathered :func:`pack_pairs`, divided by ``scale``.

    Rows are added in order, in place: values are divided inside ``gathered`` (which is
    spent), or, in a narrower wire dtype, converted one row at a time (NOTE [exchange working
    memory]). ``offsets`` (one per row) is added to each row's indices.
    """
    rows = gathered.view(-1, pair_layout(k, value_dtype, idx_dtype)[1])
    for i, row in enumerate(rows):
        values, indices = split_pairs(row, k, value_dtype, idx_dtype)
        target = out if offsets is None else out[offsets[i]:]
        target.index_add_(0, indices, values.to(out.dtype).div_(scale))
    return out


def remove_sent_(acc: torch.Tensor, pairs: torch.Tensor, k: int, value_dtype: torch.dtype,
                 idx_dtype: torch.dtype) -> None:
    """Take what :func:`pack_pairs` sent out of ``acc`` (the values it selected), in place:
    ``acc[i] -= sent[i]``, which is 0 where the wire dtype is ``acc``'s and the rounding error
    of a narrower one otherwise. ``acc`` then holds the next residual."""
    sent, idx = split_pairs(pairs, k, value_dtype, idx_dtype)
    if sent.dtype == acc.dtype:
        acc.index_put_((idx,), acc.new_zeros(()))
    else:
        acc.index_put_((idx,), sent.to(acc.dtype).neg_(), accumulate=True)


def pair_bytes(k: int, value_dtype: torch.dtype | None, numel: int) -> int:
    """Bytes of ``k`` packed pairs (:func:`pack_pairs`) of an exchange of ``numel`` elements;
    ``value_dtype`` None: fp32 values (what the wire carries for fp32 gradients)."""
    return pair_layout(k, value_dtype or torch.float32, index_dtype(numel))[1]
