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

NOTE [exchange working memory]: at density 1 (where DGC's warm-up starts) a sparse
exchange moves more bytes than the gradient itself, so what it allocates per call decides
whether a large model fits. The rules, per exchange of ``d`` elements (``k`` pairs):
- the result goes into ``out`` when the caller gives it; the DDP hook and the engine pass
  the bucket itself (consumed, as torch's all-reduce hook reduces DDP's bucket in place);
- :meth:`comm.ResidualMemory.compensate` adds the input into the residual's own buffer,
  which becomes the next residual: no new ``d``-element tensor per step;
- values and indices are written straight into one send buffer of ``k`` pairs
  (:func:`comm.collectives.pairs.pack_pairs`), the local selection is freed before the
  gather, and the gathered rows are read in place (:func:`~comm.collectives.pairs.add_pairs_`): ``(1 + P) k`` pairs, no copy of all of them;
- a stage drops what it no longer needs before it yields, and whoever drives the stages
  drops each ``Work`` (and the buffers it holds) once waited on.
At density 1 on 2 workers one exchange then peaks at 6 times its fp32 input (``gtopk``: 8,
a merge beside its selection), down from 19-23 (``tests/comm/test_exchange_memory.py``);
how many exchanges may hold their buffers at once is NOTE [in-flight budget]
(comm/in_flight.py).
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
           "reduce_scatter_flat", "nonfinite_anywhere", "set_density", "take_inter_node_bytes", "residual_sq",
           "rescale_residuals",
           "pad_to_multiple", "wire_buffer"]

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
        options: the algorithm's own options object (``comm.Algorithm.options``), kept as
            ``self.options``; :func:`comm.build_exchanger` passes the defaults when none is given.

    Raises:
        ValueError: for a density outside (0, 1], an unknown selector or wire dtype, a
            momentum outside [0, 1).
    """

    name: ClassVar[str] = "base"
    sparse: ClassVar[bool] = False

    def __init__(self, topology: Topology, *, density: float | None = None, selector: str = "mstopk",
                 error_feedback: bool = True, value_dtype=None, momentum: float = 0.0, masking: bool = True,
                 options=None):
        self.topology, self.options = topology, options
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

    def exchange(self, flat: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """Return the average over all workers of ``flat`` (same shape and dtype).

        Args:
            flat: this worker's gradient (any float tensor).
            out: where to write the average (``flat``'s shape and dtype); may be ``flat``
                itself, which is then consumed (NOTE [exchange working memory]). Default: a
                new tensor.

        Raises:
            ValueError: if ``flat`` is not a floating-point tensor, or ``out`` does not match it.
        """
        return drive(self.stages(flat, out=out))

    def stages(self, flat: torch.Tensor, *, out: torch.Tensor | None = None) -> Stages:
        """:meth:`exchange` as a generator of the ``Work`` handles to wait for (NOTE [exchange stages]).

        Raises:
            ValueError: if ``flat`` is not a floating-point tensor, or ``out`` does not match it.
        """
        if not flat.is_floating_point():
            raise ValueError(f"gradient exchange needs a float tensor, got {flat.dtype}")
        if out is not None and (out.shape != flat.shape or out.dtype != flat.dtype or not out.is_contiguous()):
            raise ValueError(f"out must be contiguous with flat's shape {tuple(flat.shape)} and dtype {flat.dtype}")
        x = flat.detach().reshape(-1)
        if not self.sparse:  # a dense bucket sends its whole momentum (NOTE [momentum correction])
            x = self.memory.correct(x)
        dst = None if out is None else out.detach().view(-1)
        result = yield from self._stages(x, dst if dst is not None and dst.dtype == self.result_dtype(x) else None)
        if dst is None:
            return result.to(flat.dtype).view(flat.shape)
        if result.data_ptr() != dst.data_ptr():
            dst.copy_(result)
        return out

    def _stages(self, x: torch.Tensor, out: torch.Tensor | None) -> Stages:  # pragma: no cover - protocol
        """The exchange of the flat ``x``; its result goes to ``out`` when given (it may be
        ``x`` itself: read ``x`` no more once ``out`` is written), else to a new tensor."""
        raise NotImplementedError

    def result_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The dtype :meth:`_stages` computes the average in: ``x``'s (sparse algorithms
        accumulate in fp32, or fp64 for fp64 inputs)."""
        if self.sparse:
            return torch.float64 if x.dtype == torch.float64 else torch.float32
        return x.dtype

    def inflight_bytes(self, numel: int) -> int:
        """Bytes of buffers an exchange of ``numel`` elements holds while its collectives
        are in flight, besides its residual and its result: an estimate that is the same
        on every rank (NOTE [in-flight budget] in comm/in_flight.py). Dense algorithms
        work on their result in place, so they hold only a copy in a narrower wire dtype."""
        return 0 if self.value_dtype in (None, torch.float32) else numel * self.value_dtype.itemsize

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


# NOTE [residuals follow the learning rate]: the papers' error feedback (DGC eq. 5-7,
# gTop-k Algorithm 4, MSTopK's Algorithm 1) keeps the residual in gradient units and the
# optimiser applies what is sent at the rate of the step that sends it. Under a constant
# rate that is exactly EF-SGD (Karimireddy et al., ICML 2019; Stich et al., NeurIPS 2018),
# whose memory holds ``lr * g``: both apply every gradient once at the rate it was computed
# with. Under a decaying rate they differ: an entry that waits ``T`` steps in the residual
# is applied at the rate of its sending step, so while a cosine schedule anneals to zero
# every delayed gradient lands at a fraction of its own rate (at density 0.01 an entry
# waits ~50-100 steps, a third of a 3-epoch CIFAR-10 run's last epoch). With the phase
# switch ``lr_scaled_residuals`` the trainer rescales every residual by ``lr_prev / lr``
# before a step whose rate changed (:func:`rescale_residuals`), which keeps the residual
# equal to EF-SGD's memory divided by the current rate: ``lr * residual`` is carried over
# unchanged, and each gradient is applied at its own rate (up to the momentum, which stays
# in gradient units as dense momentum SGD's buffer does). A step at rate 0 keeps the
# residual as it is. Measured on CIFAR-10 (docs/benchmarks/history/train.md, issue 30), three seeds: it
# helps ``gtopk``, whose residual holds 2.3x ``hitopk``'s (+0.75 points at 3 epochs, +0.60
# at 8), and not ``hitopk`` (+0.32 at 3 epochs, -0.41 at 8, inside the seeds' spread);
# neither gains on a 156-step run (-0.29, -0.12), so it is off by default, as the papers
# have it.
def rescale_residuals(exchangers: Iterable[Exchanger], factor: float) -> None:
    """Multiply every exchanger's residual by ``factor`` (NOTE [residuals follow the
    learning rate]); the momentum of a corrected exchange is left as it is.

    Raises:
        ValueError: for a factor that is not finite and positive.
    """
    if not (0.0 < float(factor) < float("inf")):
        raise ValueError(f"residual rescale factor must be finite and > 0; got {factor!r}")
    for ex in exchangers:
        ex.memory.rescale(float(factor))


def drive(stages: Stages) -> torch.Tensor:
    """Run an exchange's stages to the end, waiting on each yielded ``Work``; its result."""
    try:
        work = next(stages)
        while True:
            if work is not None:
                work.wait()
            work = None  # the buffers it holds may be freed by the next stage
            work = stages.send(None)
    except StopIteration as stop:
        return stop.value


def wire_buffer(x: torch.Tensor, wire: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
    """A dense algorithm's working copy of ``x`` in ``wire`` dtype, which it reduces in place
    and returns: ``out`` itself when it has that dtype (``x`` copied in unless ``out`` is ``x``),
    else a new tensor."""
    if out is None or out.dtype != wire:
        return x.to(wire, copy=True)
    return out if out.data_ptr() == x.data_ptr() else out.copy_(x)


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


def all_gather_async(x: torch.Tensor, group, size: int, *, out: torch.Tensor | None = None):
    """Start an all-gather of ``x`` over ``group`` in the background: ``(out, work)``; wait on ``work``
    (``None`` for one member) before reading ``out``. With one member and no ``out`` it is ``x``
    itself (read it, do not write it)."""
    if size == 1:
        return (x if out is None else out.copy_(x)), None
    if out is None:
        out = torch.empty(size * x.numel(), dtype=x.dtype, device=x.device)
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
    values = (t.coalesce().values() if t.is_sparse else t).reshape(-1)
    finite = torch.ones((), dtype=torch.bool, device=t.device)
    for piece in values.split(2**20):  # isfinite's temporaries for 1M elements at a time, not the bucket's
        finite &= torch.isfinite(piece).all()
    flag = torch.tensor([0.0 if bool(finite) else 1.0], device=t.device)
    ops.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item() > 0)
