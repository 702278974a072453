"""Node-local sampling: the ranks of a node draw the samples whose L2 shard is on their node
(their node's Redis server, or with ``shm://`` the node's own memory: NOTE [placement]).

NOTE [node-local order]
With ``locality="node"`` an epoch's order is a pure function of (seed, epoch, the home
node and the class of every sample), so every rank computes the same partition without
talking:

1. the permutation of ``seed + epoch`` (the one ``locality="global"`` uses) orders the
   samples; a second permutation from the same generator picks the exchanged ones;
2. partial exchange: the first ``round(exchange_fraction * N)`` samples of the second
   permutation, and every sample no live shard holds (home ``-1``, NOTE [placement]), are
   dealt round-robin to the nodes in that order, whatever their home; every other sample
   stays on its home node. A different random fraction moves each epoch, so no node sees
   a fixed subset forever; moved samples are read from their home shard, across the network;
3. balance: hash sharding is not perfectly even, but every rank must take the same number
   of steps. Each node gets exactly ``local_size * per_rank`` samples, ``per_rank`` as in
   NOTE [sharding and the last batch] (``ceil(N / W)``, or ``floor(N / W)`` with
   ``drop_last``). A node over that quota gives away, one at a time, a sample of the class
   it holds most of beyond its fair share (the class's count / nodes), the one last in the
   second permutation (a random one); each goes to the node under quota with the fewest of
   its class. With ``drop_last`` what is left over is not seen this epoch (at most W - 1
   samples, as with DistributedSampler), without it the nodes still short repeat their
   first samples (at most W - 1 repeats in all);
4. a node's list, in permutation order (received samples mixed in, so shuffled within
   the node; repeats at the end), is dealt to its ranks: local rank j takes every
   ``local_size``-th sample from j.

Why classes (NOTE [class-balanced nodes]): a node draws mostly the same part of the data
every epoch, and hash placement gives the parts uneven class counts (the demo's 1,200
images over 2 nodes: up to 72 / 48 of a class's 120), so each node's gradient carries
a bias of its own. Step 3 moves samples anyway; choosing them by class evens the classes
out at no cost in bytes: on the demo the nodes' class counts then differ by ~8 samples
in all instead of ~37. It does not make the rest of a node's part less fixed: only the
exchange does, and on the demo with ``hitopk`` the fixed part, not the classes, is what
costs accuracy (docs/benchmarks/history/decisions.md, "Convergence: ``--locality node`` vs ``global``").
Without labels (``labels=None``) every sample counts as one class: plain size balancing.

When N divides by W every sample is seen exactly once per epoch across all ranks. Ranks
are node-major: rank r is on node ``r // local_size``.

NOTE [validation on its node]: a validation loader with ``locality="node"`` reads only
what its node's L2 holds, so no validation byte crosses the slow inter-node link (with
global sharding every rank would read ``(nodes - 1) / nodes`` of its share from other
nodes: a whole training epoch's time on a 4 Mbit/s link, docs/benchmarks/history/train.md issue 30).
Node ``m`` validates the samples whose home is ``m``, in dataset order, dealt to its ranks
(local rank j takes every ``local_size``-th from j); samples no live shard holds (home
``-1``, read from L1 or the source wherever they are) are dealt round-robin to the nodes.
Every sample is validated exactly once and evaluation sums correct predictions over
ranks, so top-1 equals global validation's whenever that one needs no padding (N a
multiple of the world size; otherwise global validation counts up to W - 1 samples twice,
as ``DistributedSampler`` does). Ranks then run different numbers of batches, which
validation allows: it meets the other ranks only in the final sum.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["DEFAULT_EXCHANGE_FRACTION", "LOCALITIES", "NodeLocality", "node_locality"]

LOCALITIES = ("global", "node")
# NOTE [default exchange fraction]: 0.02 keeps node-local inter-node bytes per image at
# 2-4 % of global's at 2 nodes (measured in docs/benchmarks/history/decisions.md, "node-local sampling"),
# inside the 5 % target with room for the balancing moves of step 3.
DEFAULT_EXCHANGE_FRACTION = 0.02


def check_locality(locality: str, exchange_fraction: float) -> None:
    """Raises ValueError for an unknown locality or an exchange fraction outside [0, 1]."""
    if locality not in LOCALITIES:
        raise ValueError(f"unknown locality {locality!r}; valid: {list(LOCALITIES)}")
    if not 0.0 <= float(exchange_fraction) <= 1.0:
        raise ValueError(f"exchange_fraction must be in [0, 1]; got {exchange_fraction}")


@dataclass(frozen=True, eq=False)
class NodeLocality:
    """The home node of every sample and how the node-local order is drawn (NOTE [node-local order]).

    Args:
        home: node of each sample's L2 value, ``-1`` where no live shard holds it.
        local_size: ranks per node.
        exchange_fraction: share of the samples dealt across nodes each epoch, in [0, 1].
        labels: class of each sample (the dataset's ``targets``), balanced between the
            nodes; None: none (NOTE [class-balanced nodes]).
    """

    home: np.ndarray = field(repr=False)
    local_size: int
    exchange_fraction: float = DEFAULT_EXCHANGE_FRACTION
    labels: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_locality("node", self.exchange_fraction)
        if self.local_size < 1:
            raise ValueError(f"local_size must be >= 1, got {self.local_size}")
        if self.labels is not None and len(self.labels) != len(self.home):
            raise ValueError(f"labels has {len(self.labels)} entries for {len(self.home)} samples")

    @functools.cached_property
    def digest(self) -> str:
        """Short hash of the placement (saved with the resume position)."""
        return hashlib.blake2b(np.ascontiguousarray(self.home, dtype=np.int64).tobytes(), digest_size=8).hexdigest()

    def indices(self, *, epoch: int, seed: int, rank: int, world_size: int, drop_last: bool) -> list[int]:
        """This rank's sample indices for ``epoch`` (NOTE [node-local order])."""
        return self.order(epoch=epoch, seed=seed, rank=rank, world_size=world_size, drop_last=drop_last).tolist()

    def order(self, *, epoch: int, seed: int, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
        """:meth:`indices` as an int64 array."""
        n, nodes = len(self.home), world_size // self.local_size
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g).numpy()
        mix = torch.randperm(n, generator=g).numpy()  # a second draw: who is exchanged, dealt in this order
        label = np.zeros(n, dtype=np.int64) if self.labels is None else np.asarray(self.labels, dtype=np.int64)
        node = self.home.astype(np.int64)
        dealt = node < 0
        dealt[mix[:round(self.exchange_fraction * n)]] = True
        chosen = mix[dealt[mix]]
        node[chosen] = np.arange(len(chosen)) % nodes
        counts = np.zeros((nodes, int(label.max(initial=0)) + 1), dtype=np.int64)  # samples per node and class
        np.add.at(counts, (node, label), 1)
        per_rank = n // world_size if drop_last else math.ceil(n / world_size)
        quota = self.local_size * per_rank
        late = np.empty(n, dtype=np.int64)
        late[mix] = np.arange(n)
        share = np.bincount(label, minlength=counts.shape[1]) / nodes  # each node's fair count per class
        spare = [i for m in range(nodes) for i in self._surplus(np.flatnonzero(node == m), m, counts, label, late,
                                                                 share, quota)]
        node[spare] = -1
        room = quota - counts.sum(axis=1)
        for i in spare:  # step 3: to the node with room that has the fewest of its class
            short = np.flatnonzero(room > 0)
            if not len(short):  # drop_last: left over this epoch
                break
            m = int(short[np.argmin(counts[short, label[i]])])
            node[i], room[m] = m, room[m] - 1
            counts[m, label[i]] += 1
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
        mine = np.flatnonzero(node == rank // self.local_size)
        mine = mine[np.argsort(position[mine], kind="stable")]  # in permutation order: shuffled within the node
        pad = mine if len(mine) else order
        mine = np.concatenate([mine, np.resize(pad, quota - len(mine))])
        return mine[rank % self.local_size::self.local_size]

    def validation_indices(self, *, rank: int, world_size: int) -> list[int]:
        """This rank's share of the validation samples its node holds (NOTE [validation on its node])."""
        return self.validation_order(rank=rank, world_size=world_size).tolist()

    def validation_order(self, *, rank: int, world_size: int) -> np.ndarray:
        """:meth:`validation_indices` as an int64 array."""
        nodes = world_size // self.local_size
        node = self.home.astype(np.int64)
        lost = np.flatnonzero(node < 0)
        node[lost] = np.arange(len(lost)) % nodes
        mine = np.flatnonzero(node == rank // self.local_size)
        return mine[rank % self.local_size::self.local_size]

    @staticmethod
    def _surplus(part: np.ndarray, m: int, counts: np.ndarray, label: np.ndarray, late: np.ndarray,
                 share: np.ndarray, quota: int) -> list[int]:
        """What node ``m`` (holding ``part``) gives away above ``quota``, one sample at a time
        from the class it has most of beyond its ``share``, the last of that class in ``mix``
        (a random one); ``counts`` loses them."""
        extra = len(part) - quota
        if extra <= 0:
            return []
        part = part[np.argsort(late[part], kind="stable")]
        part = part[np.argsort(label[part], kind="stable")]  # by class, each class last in ``mix`` at its end
        end = np.cumsum(np.bincount(label[part], minlength=counts.shape[1]))  # one past each class's last
        left = end - np.concatenate([[0], end[:-1]])
        out = []
        for _ in range(extra):
            c = int(np.argmax(np.where(left > 0, counts[m] - share, -np.inf)))
            left[c] -= 1
            out.append(int(part[end[c] - 1]))
            end[c] -= 1
            counts[m, c] -= 1
        return out


def node_locality(folder, *, locality: str, exchange_fraction: float, local_size: int | None, rank: int,
                  world_size: int, train: bool) -> NodeLocality | None:
    """The :class:`NodeLocality` of a loader, or None for the global order.

    None for ``locality="global"`` and a single node. A validation loader (``train``
    False) gets one too: it validates its node's samples (NOTE [validation on its node]). The placement is asked of the store once; when torch.distributed is
    initialised with this world size, rank 0's answer is broadcast so that every rank
    draws from the same partition even if a shard fails while they start.

    Raises:
        ValueError: unknown locality, exchange_fraction outside [0, 1], a local_size that
            does not divide the world size.
        LocalityError: the cache cannot tell where samples are (no L2, the embedded server,
            a URL count other than the node count, a cluster primary on no listed node).
    """
    from cachepipe.l2.placement import LocalityError

    check_locality(locality, exchange_fraction)
    if locality == "global":
        return None
    if local_size is None:
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if local_size < 1 or world_size % local_size:
        raise ValueError(f"local_size must divide the world size ({world_size} ranks); got {local_size}")
    nodes = world_size // local_size
    if nodes == 1:
        return None
    cache = getattr(folder, "cache", None)
    l2 = cache.config.l2 if cache is not None else None
    if l2 is None or not l2.enabled:
        raise LocalityError("locality='node' needs an L2 that places samples on nodes; this loader has no L2 "
                            "(l2=False or cache=False): pass l2=['shm://'] or l2=[url of node 0's Redis, ...]")
    if l2.is_embedded:
        raise LocalityError(f"locality='node' cannot place samples on {nodes} nodes with the embedded Redis "
                            "(private to one machine): pass l2=['shm://'] (each node's memory) or "
                            "l2=[url of node 0's server, url of node 1's, ...]")
    try:
        home = np.asarray(cache.store.node_of(range(len(folder)), nodes), dtype=np.int64)
    except LocalityError as exc:
        raise LocalityError(f"locality='node' with {world_size} ranks of local_size {local_size}: {exc}") from None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() == world_size:
        on = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        shared = torch.from_numpy(home).to(on)
        dist.broadcast(shared, src=0)
        home = shared.cpu().numpy()
    labels = getattr(folder, "targets", None)
    return NodeLocality(home, local_size, float(exchange_fraction), None if labels is None else np.asarray(labels))
