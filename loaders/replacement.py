"""Replacing bad samples so that every batch stays full.

NOTE [replacing bad samples]: with ``on_error="skip"`` a sample that cannot be read or
decoded (``CorruptSampleError``, or an ``OSError`` such as an NFS EIO) is not dropped
from its batch: it is replaced by another sample drawn from ``(key, index, attempt)``
alone, where ``key`` is the batch's seed (seed, epoch, rank, batch number; NOTE [batch
requests carry the epoch state] in ``loaders.sampler``). So every batch keeps its size,
every rank takes the same number of steps (a shorter or empty batch on one rank would
leave the others waiting in a collective), and the same batch is rebuilt identically after
a resume, with any worker count, in the torch and the DALI loaders alike. A replacement
that is bad too draws again (attempt + 1), up to ``MAX_ATTEMPTS`` rounds; a batch that
still cannot be filled raises, naming the files.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from cachepipe import CorruptSampleError

__all__ = ["MAX_ATTEMPTS", "replacement_index", "fill_batch"]

MAX_ATTEMPTS = 8


def replacement_index(key: str, index: int, attempt: int, num_samples: int) -> int:
    """The sample that stands in for bad ``index`` at ``attempt`` (0, 1, ...), in ``[0, num_samples)``.

    Example:
        >>> replacement_index("0/3/1/7", 12, 0, 100) == replacement_index("0/3/1/7", 12, 0, 100)
        True
    """
    digest = hashlib.blake2b(f"{key}|{index}|{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % num_samples


def fill_batch(fetch: Callable[[list[int]], list[np.ndarray | None]], indices: Sequence[int], *, key: str,
               num_samples: int, name: Callable[[int], str]) -> tuple[list[np.ndarray], list[int], list[int]]:
    """Fetch ``indices`` and replace the bad ones (NOTE [replacing bad samples]).

    Args:
        fetch: reads a list of indices, ``None`` for each bad one.
        indices: the batch.
        key: the batch's seed string.
        num_samples: dataset length (replacements are drawn from it).
        name: the file of an index, for the error.

    Returns:
        ``(samples, used_indices, bad_indices)``: one sample per position of ``indices``,
        the index each position finally holds, and every bad index met.

    Raises:
        CorruptSampleError: a position still bad after ``MAX_ATTEMPTS`` draws.
    """
    used = [int(i) for i in indices]
    samples = fetch(used)
    bad: list[int] = []
    for attempt in range(MAX_ATTEMPTS):
        holes = [k for k, s in enumerate(samples) if s is None]
        if not holes:
            return samples, used, bad
        bad.extend(used[k] for k in holes)
        draws = [replacement_index(key, indices[k], attempt, num_samples) for k in holes]
        for k, s, j in zip(holes, fetch(draws), draws):
            samples[k], used[k] = s, j
    holes = [k for k, s in enumerate(samples) if s is None]
    if not holes:
        return samples, used, bad
    raise CorruptSampleError(f"batch still has {len(holes)} bad sample(s) after {MAX_ATTEMPTS} replacements "
                             f"(e.g. {name(used[holes[0]])}); is most of the dataset unreadable?",
                             index=used[holes[0]])
