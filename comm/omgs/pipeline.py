"""Pipelined merged-group sparse exchange: compress each group as soon as backward has
produced all its gradients and start its all-gather asynchronously (OMGS-SGD, Alg. 2).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist

from comm.omgs.codec import compress, unpack_add
from comm.omgs.model import groups_from_plan, selected_count
from comm.omgs.planner import lags_plan
from comm.topk import get_selector

__all__ = ["OMGSExchanger", "resolve_group", "ordered_params", "broadcast_plan"]


def resolve_group(topology=None):
    """A process group from ``None`` (default group), a ProcessGroup, or a topology object
    exposing ``world_group`` or ``group``."""
    if topology is None:
        return None
    for attr in ("world_group", "group"):
        if hasattr(topology, attr):
            return getattr(topology, attr)
    return topology


def ordered_params(model) -> list[torch.nn.Parameter]:
    """Trainable parameters in forward order: ``model.parameters()`` or an explicit list."""
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else list(model)
    return [p for p in params if p.requires_grad]


def broadcast_plan(plan: Sequence[bool], topology=None, src: int = 0) -> list[bool]:
    """Rank ``src``'s plan on every rank (plans computed from per-rank timings differ).

    Collective: every rank calls it with a plan of the same length.
    """
    flags = torch.tensor([bool(m) for m in plan], dtype=torch.uint8)
    dist.broadcast(flags, src=src, group=resolve_group(topology))
    return [bool(f) for f in flags.tolist()]


def _check_same_layout(groups, group) -> None:
    """NOTE [same plan everywhere]: all-gather sizes must match on every rank, so the
    exchanger refuses to start when ranks disagree on the groups (one collective)."""
    sizes = torch.tensor([len(groups)] + [g.numel for g in groups], dtype=torch.int64)
    length = torch.tensor([sizes.numel()])
    dist.all_reduce(length, op=dist.ReduceOp.MAX, group=group)
    padded = torch.full((int(length),), -1, dtype=torch.int64)
    padded[:sizes.numel()] = sizes
    lo = padded.clone()
    dist.all_reduce(padded, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
    if not torch.equal(padded, lo):
        raise ValueError("ranks disagree on the OMGS groups (plan or parameter order); "
                         "compute the plan once and share it, e.g. with broadcast_plan()")


class _Group:
    __slots__ = ("params", "offsets", "numel", "k", "acc", "ready", "packed", "outputs", "work",
                 "compress_s")

    def __init__(self, params, k, device):
        self.params = params
        sizes = [p.numel() for p in params]
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.numel = sum(sizes)
        self.k = k
        self.acc = torch.zeros(self.numel, dtype=torch.float32, device=device)  # residual
        self.compress_s = 0.0  # cumulative time of this group's compression (for cost fits)
        self.ready = 0
        self.packed = self.outputs = self.work = None


class OMGSExchanger:
    """Sparse gradient exchange by merged groups, overlapped with backward.

    NOTE [launch order]
    Groups are launched strictly in backward order (last group first). A group that is
    complete before the groups behind it waits for them, so every rank issues the same
    sequence of all-gathers whatever order autograd fires the hooks in. Parameters that
    got no gradient in a backward are treated as zero in :meth:`synchronize`; every rank
    must leave the same parameters without gradient (as DDP requires).

    Args:
        model: an ``nn.Module`` or a list of parameters, in forward order (the order the
            plan indexes; NOTE [OMGS conventions]).
        topology: ``None`` (default process group), a ProcessGroup, or an object with a
            ``world_group``/``group`` attribute.
        density: fraction ``rho`` of each group's entries sent, in (0, 1].
        selector: top-k selector name from ``comm.topk.SELECTORS`` (default ``"exact"``).
        plan: ``merged`` list (``find_merged_layers``); ``None`` means every parameter
            alone (LAGS).
        error_feedback: keep what was not sent and add it next time (default True).
        pipelined: exchange during backward via post-accumulate-grad hooks (default
            True); False exchanges everything in :meth:`synchronize` (reference mode).

    Raises:
        ValueError: on a bad density, an unknown selector or a plan of the wrong length.

    Example:
        >>> ex = OMGSExchanger(model, density=0.001, plan=plan)  # doctest: +SKIP
        >>> loss.backward(); ex.synchronize(); optimizer.step()  # doctest: +SKIP
    """

    def __init__(self, model, topology=None, *, density: float, selector: str = "exact",
                 plan: Sequence[bool] | None = None, error_feedback: bool = True,
                 pipelined: bool = True):
        if not 0 < density <= 1:
            raise ValueError(f"density must be in (0, 1], got {density}")
        self.params = ordered_params(model)
        if not self.params:
            raise ValueError("no trainable parameters")
        self.plan = list(plan) if plan is not None else lags_plan(len(self.params))
        if len(self.plan) != len(self.params):
            raise ValueError(f"plan has {len(self.plan)} entries for {len(self.params)} parameters")
        self.density, self.error_feedback, self.pipelined = density, error_feedback, pipelined
        self.selector = get_selector(selector)
        self.group = resolve_group(topology)
        self.world_size = dist.get_world_size(self.group)
        device = self.params[0].device
        self.groups = [_Group(self.params[s:e], selected_count(sum(p.numel() for p in self.params[s:e]), density),
                              device) for s, e in groups_from_plan(self.plan)]
        _check_same_layout(self.groups, self.group)
        self._next = len(self.groups) - 1  # next group to launch (backward order)
        self.enabled = True  # False: the hooks do nothing (see no_sync)
        self._scratch = None  # decompression buffer, allocated once (large allocations are slow)
        self.stats = {"compress_s": 0.0, "wait_s": 0.0, "sync_s": 0.0}  # cumulative seconds
        self._handles = []
        if pipelined:
            for g in self.groups:
                for p in g.params:
                    self._handles.append(p.register_post_accumulate_grad_hook(
                        lambda _p, g=g: self._on_grad(g)))

    # -- backward side -------------------------------------------------------------------
    def _on_grad(self, g: _Group) -> None:
        if not self.enabled:
            return
        g.ready += 1
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        while self._next >= 0:
            g = self.groups[self._next]
            if not force and g.ready < len(g.params):
                return
            self._launch(g)
            self._next -= 1

    def _launch(self, g: _Group) -> None:
        t0 = time.perf_counter()
        for p, off in zip(g.params, g.offsets):
            if p.grad is not None:
                g.acc[off:off + p.numel()].add_(p.grad.reshape(-1))
        g.packed = compress(g.acc, g.k, self.selector, self.error_feedback)
        g.compress_s += time.perf_counter() - t0
        self.stats["compress_s"] += time.perf_counter() - t0
        g.outputs = [torch.empty_like(g.packed) for _ in range(self.world_size)]
        g.work = dist.all_gather(g.outputs, g.packed, group=self.group, async_op=True)

    # -- optimiser side ------------------------------------------------------------------
    def synchronize(self) -> None:
        """Finish every exchange and leave the averaged sparse gradients in ``p.grad``.

        Groups not launched yet (non-pipelined mode, parameters without gradient) are
        launched now, in backward order.
        """
        t_sync = time.perf_counter()
        self._launch_ready(force=True)
        for g in reversed(self.groups):
            t0 = time.perf_counter()
            g.work.wait()
            self.stats["wait_s"] += time.perf_counter() - t0
            if self._scratch is None:
                self._scratch = torch.zeros(max(x.numel for x in self.groups), device=g.acc.device)
            out = self._scratch[:g.numel].zero_()
            for buf in g.outputs:
                unpack_add(out, buf, g.k)
            out.div_(self.world_size)
            for p, off in zip(g.params, g.offsets):
                flat = out[off:off + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = flat.to(p.dtype).clone()
                else:
                    p.grad.copy_(flat)
            g.ready, g.packed, g.outputs, g.work = 0, None, None, None
        self._next = len(self.groups) - 1
        self.stats["sync_s"] += time.perf_counter() - t_sync

    wait = synchronize

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally (hooks ignored); the next backward outside the
        context exchanges the accumulated gradients."""
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True

    def remove(self) -> None:
        """Remove the autograd hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    # -- residuals -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Residuals (one flat tensor per group) and the plan, for checkpoints."""
        return {"plan": list(self.plan), "density": self.density,
                "residuals": [g.acc.detach().clone().cpu() for g in self.groups]}

    def load_state_dict(self, state: dict) -> None:
        """Restore residuals saved by :meth:`state_dict`.

        Raises:
            ValueError: if the plan or the residual sizes do not match.
        """
        if list(state["plan"]) != self.plan:
            raise ValueError("saved OMGS plan differs from this exchanger's plan")
        residuals: Iterable[torch.Tensor] = state["residuals"]
        if len(residuals) != len(self.groups):
            raise ValueError(f"expected {len(self.groups)} residuals, got {len(residuals)}")
        for g, r in zip(self.groups, residuals):
            if r.numel() != g.numel:
                raise ValueError(f"residual of {r.numel()} elements for a group of {g.numel}")
            g.acc.copy_(r.reshape(-1))
