"""Epoch order, rank sharding, batching and resume position, shared by the torch and DALI loaders.

NOTE [batch requests carry the epoch state]: the sampler yields ``BatchRequest`` objects
(a list of dataset indices plus epoch, batch number, crop size and an augmentation seed).
DataLoader workers receive each request through their index queue, so ``set_size`` and
``set_epoch`` reach persistent workers without rebuilding them, and a batch's augmentation
depends only on (seed, epoch, rank, batch number): the same for any worker count, and
the same again after resuming.

NOTE [loader read-ahead]: with ``read_ahead`` = k (the loader sets its worker count, at
least 1) each request also carries ``ahead``, the indices of batch ``number + k``: the
next batch the same DataLoader worker is handed (workers take batches in turn), so a
worker whose batch missed the cache starts that batch's source reads while it transforms
this one (NOTE [reads in flight] in ``cachepipe/l1/raw_levels.py``).

NOTE [sharding and the last batch]: one permutation per epoch from ``seed + epoch`` (the
rule and the numbers of ``torch.utils.data.DistributedSampler``), identical on every rank;
rank r takes every world_size-th index from r. With ``drop_last=True`` the permutation is
cut to a multiple of world_size and each rank's partial last batch is dropped; with
``drop_last=False`` it is padded by wrapping around (at most world_size - 1 repeats) and
the partial last batch is kept. Every rank thus has the same number of batches of the
same sizes and all ranks stop on the same iteration. With ``locality`` (a
``loaders.locality.NodeLocality``) the ranks of a node draw from their node's samples
instead (NOTE [node-local order]), with the same counts per rank.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Iterator

import numpy as np
import torch

__all__ = ["BatchRequest", "SamplerControls", "ShardedBatchSampler", "shard_indices", "shard_order"]


class BatchRequest(list):
    """Dataset indices of one batch, with the state needed to transform it (see NOTE above)."""

    def __init__(self, indices, *, epoch: int = 0, number: int = 0, size: int = 224, seed: str = "",
                 ahead: list[int] | None = None) -> None:
        super().__init__(indices)
        self.epoch, self.number, self.size, self.seed = epoch, number, size, seed
        self.ahead = ahead or []  # the indices this worker fetches next (NOTE [loader read-ahead])

    def __reduce__(self):
        return (_rebuild_request, (list(self), self.epoch, self.number, self.size, self.seed, self.ahead))


def _rebuild_request(indices, epoch, number, size, seed, ahead=None) -> BatchRequest:
    return BatchRequest(indices, epoch=epoch, number=number, size=size, seed=seed, ahead=ahead)


def shard_indices(num_samples: int, *, epoch: int, seed: int, rank: int, world_size: int,
                  shuffle: bool, drop_last: bool) -> list[int]:
    """This rank's sample indices for ``epoch`` (NOTE [sharding and the last batch]).

    Example:
        >>> shard_indices(5, epoch=0, seed=0, rank=1, world_size=2, shuffle=False, drop_last=False)
        [1, 3, 0]
    """
    return shard_order(num_samples, epoch=epoch, seed=seed, rank=rank, world_size=world_size, shuffle=shuffle,
                       drop_last=drop_last).tolist()


def shard_order(num_samples: int, *, epoch: int, seed: int, rank: int, world_size: int,
                shuffle: bool, drop_last: bool) -> np.ndarray:
    """:func:`shard_indices` as an int64 array: an epoch of 1.28M samples is 10 MB, not a
    list of 1.28M Python ints (~46 MB in the training process for the whole epoch)."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(num_samples, generator=g).numpy()
    else:
        order = np.arange(num_samples, dtype=np.int64)
    if drop_last:
        order = order[:(num_samples // world_size) * world_size]
    else:  # wrap around: the first samples again, as often as needed
        order = np.resize(order, math.ceil(num_samples / world_size) * world_size)
    return order[rank::world_size]


class ShardedBatchSampler:
    """Batches of this rank's share of each epoch; a ``batch_sampler`` for torch's DataLoader.

    Args:
        num_samples: dataset length (>= 1).
        batch_size: samples per batch (>= 1).
        shuffle: reshuffle every epoch (training) or keep the dataset order (validation).
        seed: base of every epoch's permutation and augmentation; equal on all ranks.
        rank: this process's rank in [0, world_size).
        world_size: number of ranks (>= 1).
        drop_last: see NOTE [sharding and the last batch].
        size: crop size carried by every request (progressive resizing: ``set_size``).
        locality: a ``NodeLocality`` for node-local order (validation, unshuffled: this
            rank's share of its node's samples, NOTE [validation on its node]), or None
            (default) for the global order.

    Raises:
        ValueError: for out-of-range arguments, or when no full batch exists with
            ``drop_last=True``.
    """

    def __init__(self, num_samples: int, batch_size: int, *, shuffle: bool, seed: int = 0, rank: int = 0,
                 world_size: int = 1, drop_last: bool = False, size: int = 224, locality=None) -> None:
        if num_samples < 1 or batch_size < 1:
            raise ValueError(f"need num_samples >= 1 and batch_size >= 1; got {num_samples=}, {batch_size=}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size; got {rank=}, {world_size=}")
        if drop_last and num_samples // world_size < batch_size:
            raise ValueError(f"{num_samples} samples over {world_size} rank(s) give no full batch of "
                             f"{batch_size} with drop_last=True; lower batch_size or pass drop_last=False")
        self.num_samples, self.batch_size = num_samples, batch_size
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        if locality is not None and (len(locality.home) != num_samples or world_size % locality.local_size):
            raise ValueError(f"the locality places {len(locality.home)} samples on nodes of {locality.local_size} "
                             f"ranks; this sampler has {num_samples} samples and {world_size} ranks")
        self.drop_last = drop_last
        self.locality = locality  # validation (not shuffle): NOTE [validation on its node]
        self.epoch = 0
        self.size = size
        self.start = 0  # first batch of the next pass over ``self.epoch`` (resume)
        self.read_ahead = 0  # batches between a request and the one it names as ``ahead`` (0: none)

    # ---- epoch state --------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next pass uses (keeps a resume position of that epoch)."""
        if epoch != self.epoch:
            self.start = 0
        self.epoch = int(epoch)

    def set_size(self, size: int) -> None:
        """Crop size for batches requested from now on."""
        if int(size) < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = int(size)

    def per_rank(self) -> int:
        """Samples this rank sees per epoch."""
        if self.drop_last:
            return self.num_samples // self.world_size
        return math.ceil(self.num_samples / self.world_size)

    def __len__(self) -> int:
        n = len(self.order()) if self.locality is not None and not self.shuffle else self.per_rank()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def request(self, indices: list[int], number: int) -> BatchRequest:
        return BatchRequest(indices, epoch=self.epoch, number=number, size=self.size,
                            seed=f"{self.seed}/{self.epoch}/{self.rank}/{number}")

    def indices(self) -> list[int]:
        """This rank's samples of the current epoch, in order."""
        return self.order().tolist()

    def order(self) -> np.ndarray:
        """:meth:`indices` as an int64 array (what iterating uses: no list of N ints)."""
        if self.locality is not None and not self.shuffle:
            return self.locality.validation_order(rank=self.rank, world_size=self.world_size)
        if self.locality is not None:
            return self.locality.order(epoch=self.epoch, seed=self.seed, rank=self.rank,
                                       world_size=self.world_size, drop_last=self.drop_last)
        return shard_order(self.num_samples, epoch=self.epoch, seed=self.seed, rank=self.rank,
                           world_size=self.world_size, shuffle=self.shuffle, drop_last=self.drop_last)

    def _locality_state(self) -> dict:
        loc = self.locality
        if loc is None:
            return {"locality": "global", "exchange_fraction": 0.0, "placement": ""}
        return {"locality": "node", "exchange_fraction": loc.exchange_fraction, "placement": loc.digest}

    def __iter__(self) -> Iterator[BatchRequest]:
        order = self.order()
        start, self.start = self.start, 0
        bs, stride = self.batch_size, self.read_ahead
        for number in range(start, len(self)):
            request = self.request(order[number * bs:(number + 1) * bs].tolist(), number)
            if stride and number + stride < len(self):  # NOTE [loader read-ahead]
                request.ahead = order[(number + stride) * bs:(number + stride + 1) * bs].tolist()
            yield request

    # ---- resume -------------------------------------------------------------------------
    def state_dict(self, batches_done: int) -> dict:
        """Position after ``batches_done`` batches of the current epoch."""
        return {"epoch": self.epoch, "batches_done": int(batches_done), "seed": self.seed, "size": self.size,
                "num_samples": self.num_samples, "batch_size": self.batch_size, "world_size": self.world_size,
                **self._locality_state()}

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next pass yields the batches after ``state["batches_done"]``.

        A state saved with another placement of the samples on the nodes (a shard that
        died or came back in between) resumes at the same position with a warning: the
        rest of that epoch's samples then differ from the uninterrupted run's.

        Raises:
            ValueError: when the state was saved with a different dataset length, batch size,
                world size, seed, locality or exchange fraction (the remaining samples
                would not be the same).
        """
        mine = {"seed": self.seed, "num_samples": self.num_samples, "batch_size": self.batch_size,
                "world_size": self.world_size, **self._locality_state()}
        saved = {"locality": "global", "exchange_fraction": 0.0, "placement": "", **state}  # older states: global
        for key in ("seed", "num_samples", "batch_size", "world_size", "locality", "exchange_fraction"):
            if saved[key] != mine[key]:
                raise ValueError(f"cannot resume: state has {key}={saved[key]!r}, this loader has {mine[key]!r}")
        if saved["placement"] != mine["placement"]:
            warnings.warn("resuming with another placement of the samples on the nodes than when the state was "
                          "saved (a shard died or came back?): the rest of this epoch's samples differ from the "
                          "uninterrupted run's", RuntimeWarning, stacklevel=2)
        if not 0 <= state["batches_done"] <= len(self):
            raise ValueError(f"batches_done={state['batches_done']} outside [0, {len(self)}]")
        self.epoch, self.size = int(state["epoch"]), int(state["size"])
        self.start = int(state["batches_done"])


class SamplerControls:
    """Epoch, crop size and resume position of a loader, all kept by its ``sampler``.

    Mixed into ``CachedDataLoader`` and ``DALILoader``; the loader sets ``self.sampler``
    (a :class:`ShardedBatchSampler`) and counts ``self.batches_done`` in the current epoch.
    """

    sampler: ShardedBatchSampler
    batches_done: int

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s permutation (seeded by ``seed + epoch``, the same on every rank)."""
        self.sampler.set_epoch(epoch)

    def set_size(self, size: int) -> None:
        """Crop size from the next batch requested on (progressive resizing, no cache rebuild).

        Call it between epochs: workers may already hold prefetched batches of the old size
        while an epoch is running.
        """
        self.sampler.set_size(size)

    @property
    def size(self) -> int:
        return self.sampler.size

    def state_dict(self) -> dict:
        """Position in the current epoch (batches yielded so far) plus what must match on resume."""
        return self.sampler.state_dict(self.batches_done)

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration yields exactly the batches after the saved position.

        Raises:
            ValueError: the state belongs to a loader with a different dataset length,
                batch size, world size or seed.
        """
        self.sampler.load_state_dict(state)
        self.batches_done = self.sampler.start
