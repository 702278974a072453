"""Intra-node collectives through a shared-memory segment (CPU tensors), like NCCL's SHM transport.

gloo has no shared-memory transport: two workers of one node exchange a gradient over
TCP loopback, which costs several copies through the kernel and a lot of CPU. Here the
workers of a node map one segment of ``/dev/shm``; a collective is a copy into the
segment, a barrier, and reads (or sums) straight out of it.

NOTE [shm segment lifetime]: the members meet in a barrier first, so nobody is still busy
elsewhere; then local rank 0 creates the segment file, the others open and map it, and
local rank 0 unlinks it as soon as everyone has it (after a collective that every member
joins only once mapped; in a ``finally``, so also when a member fails). The mapping lives
on in the processes, the name does not: nothing is left in ``/dev/shm`` after the group
is dropped or a worker dies, except when local rank 0 is killed inside the milliseconds
between create and unlink (before the barrier, a member that waited for a slow peer
with the file created was a window of seconds). Such a leftover is removed by the next
group that starts on the machine once its maker is proven dead (NOTE [shm segment names]
in ``comm.shm_names``). The segment grows on
demand; every member grows it at the same call because collective sizes agree. Its pages
are allocated when it is created (``posix_fallocate``), so a full ``/dev/shm`` (Docker's
default is 64 MiB) is a clean failure, not a SIGBUS later: every member then learns it
from the same collective, and operations that do not fit return ``None`` so the caller
uses the process group. A segment holds ``size`` times the largest tensor exchanged.

NOTE [shm synchronisation]: every operation is ``barrier (no one still reads the
previous operation's data) -> write my part -> barrier (everyone's part is there) ->
read``; when the segment has just grown, the collectives that mapped it stand in for
the first barrier. Barriers run over the intra-node gloo group. Sums run in rank order,
so every member computes bit-identical results. Two barriers cost more than gloo's own
loopback round trips for small tensors, so operations that use less than ``min_bytes``
of the segment return ``None`` and the caller uses the process group (where gloo stops
winning: ``docs/benchmarks/history/decisions.md``, "Measurements behind design decisions").
"""
from __future__ import annotations

import mmap
import os

import torch
import torch.distributed as dist

from comm import collective_ops as ops
from comm.shm_names import SHM_DIR, new_base, remove_orphans

__all__ = ["SharedMemoryGroup"]

_NAME_BYTES = 96  # a flag byte, then the file name, zero-padded
_ALIGN = 2**20


class SharedMemoryGroup:
    """Collectives among the ``size`` workers of one node over a shared-memory segment.

    Build it with :meth:`create` (collective over ``group``), which returns ``None`` when
    the members do not share ``/dev/shm`` (different hosts or containers), so the caller
    keeps using the process group. Tensors must be 1-D CPU tensors; results never alias
    the segment. Every operation is collective and returns ``None``, on every member,
    when it would use less than ``min_bytes`` of the segment (NOTE [shm synchronisation])
    or the segment cannot grow to hold it (NOTE [shm segment lifetime]).

    Args:
        group: the intra-node process group (gloo), used for barriers and set-up.
        rank: this member's index in ``group``.
        size: number of members.

    Attributes:
        min_bytes: smallest operation (bytes of the segment it uses) carried here; default 4 MiB.

    Example:
        >>> shm = SharedMemoryGroup.create(topo.intra_group, topo.local_rank, topo.local_size)  # doctest: +SKIP
        >>> mine = shm.reduce_scatter(grad)   # sum over the node of chunk ``local_rank``
    """

    min_bytes = 4 * 2**20

    def __init__(self, group, rank: int, size: int):
        self.group, self.rank, self.size = group, rank, size
        self.name = new_base()  # replaced by local rank 0's when mapping (NOTE [shm segment names])
        self._buffer = torch.empty(0, dtype=torch.uint8)
        self._generation = 0
        self._too_big = None  # the smallest segment size that failed to map

    @classmethod
    def create(cls, group, rank: int, size: int) -> "SharedMemoryGroup | None":
        """Map a first segment on every member (collective); ``None`` if they cannot share one.

        Local rank 0 first removes segments left by dead processes (NOTE [shm segment names])."""
        if rank == 0:
            remove_orphans()
        shm = cls(group, rank, size)
        return shm if shm._map(_ALIGN) else None

    @property
    def capacity(self) -> int:
        """Bytes of the current segment."""
        return self._buffer.numel()

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor | None:
        """Sum of ``x`` over the members, chunk ``rank`` of ``ceil(numel / size)`` elements.

        ``x`` is treated as zero-padded to a multiple of ``size``.

        Raises:
            ValueError: for a tensor that is not 1-D on the CPU.
        """
        n, r, d = self.size, self.rank, _check(x)
        c = -(-d // n)
        slots = self._begin(n * n * c, x.dtype)
        if slots is None:
            return None
        # slot src * n + j holds chunk j of member src; nobody writes the chunk it keeps
        for j in range(n):
            if j != r:
                _copy_chunk(slots[(r * n + j) * c: (r * n + j + 1) * c], x, j * c)
        self._barrier()
        mine = x[r * c: (r + 1) * c]
        if mine.numel() < c:
            mine = torch.cat([mine, mine.new_zeros(c - mine.numel())])
        sources = [mine if src == r else slots[(src * n + r) * c: (src * n + r + 1) * c] for src in range(n)]
        out = torch.add(sources[0], sources[1])
        for s in sources[2:]:
            out += s
        return out

    def all_gather(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """The members' ``x`` (equal sizes) concatenated in rank order (into ``out`` if given).

        Raises:
            ValueError: for a tensor that is not 1-D on the CPU.
        """
        n, d = self.size, _check(x)
        slots = self._begin(n * d, x.dtype)
        if slots is None:
            return None
        slots[self.rank * d: (self.rank + 1) * d].copy_(x)
        self._barrier()
        return slots[: n * d].clone() if out is None else out.copy_(slots[: n * d])

    def reduce_(self, x: torch.Tensor) -> torch.Tensor | None:
        """Sum ``x`` over the members into member 0's ``x`` (in place; others unchanged).

        Raises:
            ValueError: for a tensor that is not 1-D on the CPU.
        """
        n, d = self.size, _check(x)
        slots = self._begin(n * d, x.dtype)
        if slots is None:
            return None
        if self.rank:
            slots[self.rank * d: (self.rank + 1) * d].copy_(x)
        self._barrier()
        if self.rank == 0:
            for src in range(1, n):
                x += slots[src * d: (src + 1) * d]
        return x

    def broadcast_(self, x: torch.Tensor) -> torch.Tensor | None:
        """Member 0's ``x`` copied into everyone's ``x`` (in place).

        Raises:
            ValueError: for a tensor that is not 1-D on the CPU.
        """
        d = _check(x)
        slots = self._begin(d, x.dtype)
        if slots is None:
            return None
        if self.rank == 0:
            slots.copy_(x)
        self._barrier()
        return x if self.rank == 0 else x.copy_(slots)

    # -- segment and synchronisation ----------------------------------------------------

    def _begin(self, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The segment as ``numel`` elements of ``dtype``, safe to write (NOTE [shm synchronisation]);
        ``None`` for an operation below ``min_bytes`` or when the segment cannot grow that far."""
        nbytes = numel * dtype.itemsize
        if nbytes < self.min_bytes:
            return None
        if nbytes <= self.capacity:
            self._barrier()
        elif self._too_big is not None and nbytes >= self._too_big:
            return None  # the same answer on every member: _too_big is set collectively
        elif not self._map(-(-nbytes // _ALIGN) * _ALIGN):
            return None
        return self._buffer[:nbytes].view(dtype)

    def _barrier(self) -> None:
        ops.barrier(group=self.group)

    def _map(self, nbytes: int) -> bool:
        """Replace the segment by a new one of ``nbytes`` on every member (collective).

        Returns whether every member mapped it (NOTE [shm segment lifetime]); the collective
        that says so also tells local rank 0 that the file may be unlinked, and waits for
        every reader of the old segment. On failure the old segment stays.
        """
        self._generation += 1
        path = None
        msg = torch.zeros(_NAME_BYTES, dtype=torch.uint8)
        self._barrier()  # nobody is busy elsewhere while the file exists (NOTE [shm segment lifetime])
        try:
            if self.rank == 0:
                name = f"{self.name}-{self._generation}"
                path = os.path.join(SHM_DIR, name)
                buffer = _open(path, nbytes, create=True)
                if buffer is not None:
                    msg[0] = 1
                    msg[1: 1 + len(name)] = torch.tensor(list(name.encode()), dtype=torch.uint8)
                    buffer[: len(name)].copy_(msg[1: 1 + len(name)])  # the probe: others read it back
            ops.broadcast(msg, src=dist.get_global_rank(self.group, 0), group=self.group)
            name = bytes(msg[1:].tolist()).rstrip(b"\0").decode()
            self.name = name.rpartition("-")[0] or self.name  # local rank 0's, on every member
            if self.rank != 0:
                buffer = _open(os.path.join(SHM_DIR, name), nbytes, create=False) if msg[0] else None
                if buffer is not None and bytes(buffer[: len(name)].tolist()) != name.encode():
                    buffer = None  # a same-named file that is not ours: another host's /dev/shm
            ok = torch.tensor([0 if buffer is None else 1], dtype=torch.int32)
            ops.all_reduce(ok, op=dist.ReduceOp.MIN, group=self.group)
        finally:
            if path is not None:
                _unlink(path)
        if not ok.item():
            self._too_big = nbytes
            return False
        self._buffer = buffer
        return True


def _check(x: torch.Tensor) -> int:
    if x.dim() != 1 or x.device.type != "cpu":
        raise ValueError(f"shared-memory collectives take 1-D CPU tensors, got shape {tuple(x.shape)} on {x.device}")
    return x.numel()


def _copy_chunk(dst: torch.Tensor, x: torch.Tensor, start: int) -> None:
    """``dst`` = ``x[start:start + len(dst)]``, zero-filled past the end of ``x``."""
    part = x[start: start + dst.numel()]
    dst[: part.numel()].copy_(part)
    dst[part.numel():].zero_()


def _open(path: str, nbytes: int, *, create: bool) -> torch.Tensor | None:
    """Map ``path`` (creating it with ``nbytes``) as a uint8 tensor; ``None`` if that fails."""
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    except OSError:
        return None
    try:
        if create:
            os.posix_fallocate(fd, 0, nbytes)  # ENOSPC now rather than SIGBUS on first write
        elif os.fstat(fd).st_size < nbytes:
            return None
        return torch.frombuffer(mmap.mmap(fd, nbytes), dtype=torch.uint8)
    except OSError:
        return None
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
