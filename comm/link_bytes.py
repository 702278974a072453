"""Bytes a worker puts on inter-node links, counted per collective as the exchanges issue them.

NOTE [inter-node bytes]: every exchanger adds to its ``inter_node_bytes`` what *this*
rank sends to a rank on another node (ranks are node-major, NOTE in comm/topology.py);
summed over all ranks that is what crosses between nodes. The collectives are counted as
the ring and tree algorithms that gloo and NCCL run:

- ring all-reduce of ``B`` bytes over ``q`` members: each member sends ``2 (q-1)/q * B``
  to its successor; in the world ring only the ``m`` ranks whose successor sits on the
  next node cross (``dense``: ``2 m (P-1)/P * B`` in all); in a group of one worker per
  node (``hier``'s leaders, ``2dtar``'s and ``hitopk``'s inter-node groups) every send
  crosses;
- ring all-gather of ``S`` bytes each: each member sends ``(q-1) * S`` to its successor
  (``topk_ag`` over the world ring, ``hitopk`` over its inter-node group);
- point-to-point sends (``gtopk``'s merge tree) cross when the two ranks' nodes differ;
  its broadcast is a binomial tree from rank 0, largest distance first (one crossing per
  other node when nodes hold a power of two ranks).

Intra-node traffic (shared memory or the node's own group) is not counted. Dense
exchanges count their bytes too, so a run's ratio to dense is the ratio of totals.
"""
from __future__ import annotations

__all__ = ["ring_crosses", "ring_allreduce", "ring_allgather", "crosses", "binomial_broadcast"]


def _node(rank: int, local_size: int) -> int:
    return rank // local_size


def crosses(src: int, dst: int, local_size: int) -> bool:
    """Whether a send from global rank ``src`` to ``dst`` leaves the node."""
    return _node(src, local_size) != _node(dst, local_size)


def ring_crosses(topology) -> bool:
    """Whether this rank's successor in the world ring is on another node."""
    return crosses(topology.rank, (topology.rank + 1) % topology.world_size, topology.local_size)


def ring_allreduce(nbytes: int, members: int) -> int:
    """Bytes one member of a ring all-reduce of ``nbytes`` sends to its successor."""
    return 0 if members <= 1 else 2 * (members - 1) * nbytes // members


def ring_allgather(nbytes_each: int, members: int) -> int:
    """Bytes one member of a ring all-gather of ``nbytes_each`` per member sends."""
    return (members - 1) * nbytes_each


def binomial_broadcast(nbytes: int, topology, root: int = 0) -> int:
    """Bytes this rank sends across nodes in a binomial-tree broadcast from ``root``."""
    world, me = topology.world_size, (topology.rank - root) % topology.world_size
    low = me & -me if me else 1 << max(world - 1, 0).bit_length()  # children at distances below it
    sent, mask = 0, low >> 1
    while mask:
        child = me + mask
        if child < world and crosses(topology.rank, (child + root) % world, topology.local_size):
            sent += nbytes
        mask >>= 1
    return sent
