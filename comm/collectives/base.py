"""The exchanger protocol shared by every collective, and the helpers they share.

An exchanger turns one worker's flat gradient into the average over all workers (as
DDP's all-reduce hook would), possibly sparsified, keeping its own residual memory.

NOTE [exchange stages]: an algorithm is written as a generator (``_stages``) that yields
each asynchronous ``Work`` it must wait for before going on, and returns the averaged
tensor. :meth:`Exchanger.exchange` drives it to the end at once (wait, resume);
the engine (:mod:`comm.engine`) runs it up to its first yield while backward goes on, so
several buckets can have their collectives in flight, and resumes it in
``synchronize()``. Whoever drives the stages of several buckets resumes them in the same
order on every rank, since collectives on one group must be issued in the same order;
for that every rank yields at the same points of an algorithm (``None`` where it has
nothing in flight there, as a non-leader in ``hier`` or an idle rank in a ``gtopk``
round), so the stage boundaries line up across ranks.
"""
from __future__ import annotations

from typing import ClassVar

from collections.abc import Generator, Iterable

import torch
import torch.distributed as dist

from comm import collective_ops as ops
from comm.residual import ResidualMemory
from comm.topology import Topology

__all__ = ["Exchanger", "Stages", "WIRE_DTYPES", "drive", "all_gather_flat", "all_gather_async",
           "reduce_scatter_flat", "nonfinite_anywhere", "index_dtype", "pack_pairs", "add_pairs_",
           "set_density", "take_inter_node_bytes", "residual_sq",
           "pad_to_multiple"]

Stages = Generator[object, None, torch.Tensor]  # yields Work handles, returns the result

WIRE_DTYPES = {None: None, "fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16,
               "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


class Exchanger:
    """Base class: ``exchange(flat) -> averaged flat`` plus residual ``state_dict``.

    Args:
        topology: the :class:`comm.Topology` to exchange over.
        density: fraction ``rho`` of entries a sparse algorithm sends (``0 < rho <= 1``);
            ignored by dense algorithms.
        selector: top-k selector name from ``comm.topk.SELECTORS`` (sparse algorithms).
        error_feedback: keep what was not applied and add it back next step.
        momentum: DGC momentum correction factor (NOTE [momentum correction] in
            comm/residual.py); 0 (default) leaves momentum to the optimiser.
        masking: momentum-factor masking with momentum correction (default True).
        value_dtype: dtype of values on the wire (``torch.float16``/``bfloat16``/``float32``
            or ``"fp16"``/``"bf16"``); ``None`` sends the input's dtype.

    Raises:
        ValueError: for a density outside (0, 1], an unknown selector or wire dtype, a
            momentum outside [0, 1).
    """

    name: ClassVar[str] = "base"
    sparse: ClassVar[bool] = False

    def __init__(self, topology: Topology, *, density: float | None = None, selector: str = "mstopk",
                 error_feedback: bool = True, value_dtype=None, momentum: float = 0.0, masking: bool = True):
        self.topology = topology
        if isinstance(value_dtype, str) or value_dtype is None:
            if value_dtype not in WIRE_DTYPES:
                raise ValueError(f"unknown value_dtype {value_dtype!r}; valid: {sorted(k for k in WIRE_DTYPES if k)}")
            value_dtype = WIRE_DTYPES[value_dtype]
        elif value_dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            raise ValueError(f"value_dtype must be a float dtype, got {value_dtype!r}")
        self.value_dtype = value_dtype
        self.error_feedback = bool(error_feedback)
        self.memory = ResidualMemory(enabled=self.error_feedback and self.sparse, momentum=momentum, masking=masking)
        self.density = density
        self.selector_name = selector
        if self.sparse:
            if density is None or not (0.0 < float(density) <= 1.0):
                raise ValueError(f"{self.name} needs a density in (0, 1], got {density!r}")
            from comm.topk import get_selector

            self.select = get_selector(selector)
        self.generator: torch.Generator | None = None
        self.inter_node_bytes = 0  # NOTE [inter-node bytes] in comm/link_bytes.py

    def exchange(self, flat: torch.Tensor) -> torch.Tensor:
        """Return the average over all workers of ``flat`` (same shape and dtype).

        Raises:
            ValueError: if ``flat`` is not a floating-point tensor.
        """
        return drive(self.stages(flat))

    def stages(self, flat: torch.Tensor) -> Stages:
        """:meth:`exchange` as a generator of the ``Work`` handles to wait for (NOTE [exchange stages]).

        Raises:
            ValueError: if ``flat`` is not a floating-point tensor.
        """
        if not flat.is_floating_point():
            raise ValueError(f"gradient exchange needs a float tensor, got {flat.dtype}")
        x = flat.detach().reshape(-1)
        if not self.sparse:  # a dense bucket sends its whole momentum (NOTE [momentum correction])
            x = self.memory.correct(x)
        out = yield from self._stages(x)
        return out.to(flat.dtype).view(flat.shape)

    def _stages(self, x: torch.Tensor) -> Stages:  # pragma: no cover - protocol
        raise NotImplementedError

    def wire_dtype(self, x: torch.Tensor) -> torch.dtype:
        return self.value_dtype or x.dtype

    def topk(self, acc: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the configured selector; indices come back as int64."""
        values, indices = self.select(acc, k, generator=self.generator)
        return values, indices.long()

    def placed_residual(self, numel: int) -> torch.Tensor:
        """What this worker still owes (``memory.owed()``, gradient units) as a
        ``numel``-element vector over the exchanged tensor (zeros when there is none):
        adding it to the next input applies it."""
        res = self.memory.owed()
        return torch.zeros(numel) if res is None else res[:numel]

    def state_dict(self) -> dict:
        return {"algorithm": self.name, "memory": self.memory.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("algorithm") != self.name:
            raise ValueError(f"state of algorithm {state.get('algorithm')!r} cannot load into {self.name!r}")
        self.memory.load_state_dict(state["memory"])


def set_density(exchangers: Iterable[Exchanger], density: float) -> float:
    """Send ``density`` of every sparse exchanger's input from its next exchange on
    (density warm-up); returns it as a float.

    Raises:
        ValueError: for a density outside (0, 1].
    """
    if not 0.0 < float(density) <= 1.0:
        raise ValueError(f"density must be in (0, 1]; got {density!r}")
    for ex in exchangers:
        if ex.sparse:
            ex.density = float(density)
    return float(density)


def take_inter_node_bytes(exchangers: Iterable[Exchanger]) -> int:
    """Bytes the exchangers sent to other nodes since the last call (NOTE [inter-node
    bytes] in comm/link_bytes.py); their counters restart from zero."""
    sent = 0
    for ex in exchangers:
        sent, ex.inter_node_bytes = sent + ex.inter_node_bytes, 0
    return sent


def residual_sq(exchangers: Iterable[Exchanger]) -> float:
    """Sum of squares of the exchangers' residuals (update units under momentum correction)."""
    return sum(ex.memory.norm() ** 2 for ex in exchangers)


def drive(stages: Stages) -> torch.Tensor:
    """Run an exchange's stages to the end, waiting on each yielded ``Work``; its result."""
    try:
        work = next(stages)
        while True:
            if work is not None:
                work.wait()
            work = stages.send(None)
    except StopIteration as stop:
        return stop.value


def index_dtype(numel: int) -> torch.dtype:
    """int32 indices on the wire when they fit (half the bytes of int64)."""
    return torch.int32 if numel < 2**31 else torch.int64


def all_gather_flat(x: torch.Tensor, group, size: int, shm=None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """All-gather equal-sized 1-D tensors into one ``size * numel`` tensor (rank order).

    ``shm``: the group's :class:`comm.shm.SharedMemoryGroup`, which carries CPU tensors that
    fit in it (NOTE [intra-node transport] in comm/topology.py). ``out``: where to write the result.
    """
    if shm is not None and size > 1 and x.device.type == "cpu":
        out = torch.empty(size * x.numel(), dtype=x.dtype, device=x.device) if out is None else out
        if shm.all_gather(x, out=out) is not None:
            return out
    out, work = all_gather_async(x, group, size, out=out)
    if work is not None:
        work.wait()  # intra-node: fast, waited on at once
    return out


def reduce_scatter_flat(x: torch.Tensor, group, size: int, shm=None) -> torch.Tensor:
    """Sum ``x`` over ``group`` and keep this member's slice of ``ceil(numel / size)`` elements.

    ``x`` counts as zero-padded to a multiple of ``size``; ``shm`` as in :func:`all_gather_flat`.
    """
    if size == 1:
        return x.clone()
    if shm is not None and x.device.type == "cpu":
        out = shm.reduce_scatter(x)
        if out is not None:
            return out
    x = pad_to_multiple(x, size) if x.numel() % size else x.contiguous()
    out = torch.empty(x.numel() // size, dtype=x.dtype, device=x.device)
    ops.reduce_scatter_into(out, x, group=group)
    return out


def pack_pairs(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``values`` then ``indices`` as the bytes of one tensor: one all-gather carries both."""
    return torch.cat([values.view(torch.uint8), indices.view(torch.uint8)])


def add_pairs_(out: torch.Tensor, gathered: torch.Tensor, k: int, value_dtype: torch.dtype, idx_dtype: torch.dtype,
               scale: float, row_offsets: torch.Tensor | None = None) -> torch.Tensor:
    """Scatter-add into ``out`` the ``k`` pairs of every row of gathered :func:`pack_pairs`, divided by ``scale``.

    ``row_offsets`` (one per row) is added to the indices of each row.
    """
    split = k * value_dtype.itemsize
    rows = gathered.view(-1, split + k * idx_dtype.itemsize)
    values = rows[:, :split].contiguous().view(value_dtype)
    indices = rows[:, split:].contiguous().view(idx_dtype).long()
    if row_offsets is not None:
        indices += row_offsets.unsqueeze(1)
    return out.index_add_(0, indices.view(-1), values.view(-1).to(out.dtype).div_(scale))


def all_gather_async(x: torch.Tensor, group, size: int, *, out: torch.Tensor | None = None):
    """Start an all-gather of ``x`` over ``group`` in the background: ``(out, work)``; wait on ``work``
    (``None`` for one member) before reading ``out``."""
    if out is None:
        out = torch.empty(size * x.numel(), dtype=x.dtype, device=x.device)
    if size == 1:
        return out.copy_(x), None
    return out, ops.all_gather_into(out, x, group=group, async_op=True)


def pad_to_multiple(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` followed by zeros up to a multiple of ``n`` elements (a copy)."""
    padded = torch.zeros(-(-x.numel() // n) * n, dtype=x.dtype, device=x.device)
    padded[: x.numel()] = x
    return padded


def nonfinite_anywhere(t: torch.Tensor, group=None) -> bool:
    """Whether any worker's ``t`` holds inf/NaN (one 1-element all-reduce; collective).

    A sparse ``t`` (``torch.sparse``) is judged by its stored values.
    """
    values = t.coalesce().values() if t.is_sparse else t
    flag = torch.tensor([0.0 if bool(torch.isfinite(values).all()) else 1.0], device=t.device)
    ops.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item() > 0)
