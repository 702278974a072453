"""Gradient exchange for the training loop: one object per phase with ``synchronize()``.

``build_exchange(name, model, topology, density=..., selector=...)`` returns a
``PhaseExchange`` that averages every ``p.grad`` across ranks in place
(``synchronize()``), saves and restores error-feedback residuals (``state_dict()``),
reports ``last_timings = {"compress": s, "communicate": s}`` for the time breakdown and
releases its hooks (``close()``). Names: ``dense``, ``hier``, ``2dtar``, ``topk_ag``,
``gtopk``, ``hitopk`` (``comm.GradientExchanger`` with fused buckets) and ``omgs``
(the same engine with ``topk_ag`` on the merged layers of the OMGS planner); both start
each bucket's exchange during backward.
``build_ddp_exchange`` instead wraps the model in DDP and exchanges inside backward
(DDP's all-reduce for ``dense``, torch's PowerSGD hook for ``powersgd`` (always under
DDP), ``comm.register_sparse_hook`` for the others).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn

__all__ = ["LocalTopology", "topology_for", "build_exchange", "build_ddp_exchange", "PhaseExchange", "DDPExchange",
           "saved_residuals"]


@dataclass(frozen=True)
class LocalTopology:
    """The topology of a single process without a process group."""

    nodes: int = 1
    local_size: int = 1
    world_size: int = 1


def topology_for(world_size: int, nodes: int | None = None, local_size: int | None = None):
    """This job's ``comm.Topology``: explicit ``nodes``/``local_size`` or torchrun's environment.

    Collective when a process group exists (it creates the node-level subgroups).

    Raises:
        ValueError: when nodes x local_size differs from the world size (says what to pass).
    """
    for name, v in (("nodes", nodes), ("local_size", local_size)):
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1; got {v}")
    n = nodes or (world_size // local_size if local_size else None)
    ls = local_size or (world_size // nodes if nodes else None)
    if n is not None and (n * ls != world_size):
        raise ValueError(f"topology {n} nodes x {ls} workers = {n * ls} ranks, but the world size is "
                         f"{world_size}; pass --nodes/--local-size whose product is {world_size}")
    if not (dist.is_available() and dist.is_initialized()):
        return LocalTopology()
    from comm import Topology

    if nodes is None and local_size is None:
        return Topology.from_env()
    return Topology(nodes=n, local_size=ls)


class PhaseExchange:
    """Adapter that gives every exchanger the loop's small interface.

    Args:
        inner: a ``comm.GradientExchanger`` (or None on a single process: ``synchronize``
            is then a no-op).
    """

    def __init__(self, inner=None, layout: dict | None = None):
        self.inner, self.layout = inner, layout or {}
        self.last_timings = {"compress": 0.0, "communicate": 0.0, "compress_overlapped": 0.0}

    def synchronize(self) -> bool:
        """Finish the exchange; False when ``p.grad`` holds nothing to apply (the first step
        of a pipelined exchange: NOTE [pipelined exchange] in comm/engine.py). ``last_timings``:
        ``compress`` (top-k selection inside this call), ``communicate`` (the rest of it:
        waiting for what is still in flight), ``compress_overlapped`` (selection done
        during backward, inside its time) and ``communicate_overlapped`` (waiting inside
        backward for the previous step's pipelined exchange)."""
        if self.inner is None:
            return True
        start = time.perf_counter()
        applied = self.inner.synchronize()
        total = time.perf_counter() - start
        split = self.inner.last_timings
        self.last_timings = {"compress": split["select"], "communicate": max(total - split["select"], 0.0),
                             "compress_overlapped": split["select_overlapped"],
                             "communicate_overlapped": split["drained_in_backward"]}
        return applied

    def lookahead_grads(self) -> bool:
        """This rank's own gradients of a pipelined step still in flight, into ``p.grad``
        (NOTE [lookahead] in trainer/lookahead.py); False when there are none."""
        return self.inner is not None and self.inner.lookahead_grads()

    def flush(self) -> bool:
        """A pipelined exchange still in flight is finished into ``p.grad``: True if there
        is one more optimiser step to take (collective)."""
        return self.inner is not None and self.inner.flush()

    def state_dict(self) -> dict:
        """Residuals, plus the layout (OMGS layer order and plan) needed to rebuild alike."""
        return {"exchange": self.inner.state_dict() if self.inner is not None else {}, "layout": self.layout}

    def load_state_dict(self, state: dict) -> None:
        if self.inner is not None and state.get("exchange"):
            self.inner.load_state_dict(state["exchange"])

    def take_residuals(self) -> dict:
        """What the exchange still owes, per parameter (NOTE [residual at a phase switch])."""
        return self.inner.take_residuals() if self.inner is not None else {}

    def carry_in(self, residuals: dict) -> None:
        if self.inner is not None and residuals:
            self.inner.carry_in(residuals)

    def set_density(self, density: float) -> None:
        """Density of the sparse buckets from the next step on (density warm-up)."""
        if self.inner is not None:
            self.inner.set_density(density)

    def take_inter_node_bytes(self) -> int:
        """Bytes this rank sent to other nodes since the last call (NOTE [inter-node bytes])."""
        return self.inner.take_inter_node_bytes() if self.inner is not None else 0

    def residual_sq(self) -> float:
        """Sum of squares of this rank's residuals."""
        return self.inner.residual_sq() if self.inner is not None else 0.0

    def close(self) -> None:
        if self.inner is not None:
            self.inner.remove()


def _build_omgs(model: nn.Module, topology, *, density: float, selector: str, probe, layout,
                **engine) -> PhaseExchange:
    from comm import GradientExchanger

    params = [p for p in model.parameters() if p.requires_grad]
    if layout:  # resuming: the saved order and plan, so the residuals fit
        order, plan = list(layout["order"]), list(layout["plan"])
    elif probe is not None:  # profile backward, fit the cost model, plan (rank 0's plan everywhere)
        from comm.omgs import plan_omgs

        plan, order, _, _ = plan_omgs(model, probe, topology, density=density, selector=selector)
    else:  # no probe: every layer alone (LAGS)
        order, plan = list(range(len(params))), [False] * len(params)
    inner = GradientExchanger([params[i] for i in order], "topk_ag", topology, density=density, selector=selector,
                              plan="omgs", merged=plan, skip_nonfinite=False, **engine)
    return PhaseExchange(inner, layout={"order": order, "plan": plan})


def build_exchange(name: str, model: nn.Module, topology, *, density: float, selector: str,
                   overlap: bool = True, pipeline: bool = False, hybrid_bytes: int = 2**20, probe=None,
                   layout: dict | None = None, momentum: float = 0.0, masking: bool = True,
                   weight_decay: dict | None = None, clip_norm: float = 0.0,
                   dense_vectors: bool = False) -> PhaseExchange:
    """The exchanger for phase algorithm ``name`` (see the module docstring).

    Args:
        hybrid_bytes: buckets smaller than this use dense ``hier`` (0: never).
        overlap: exchange during backward (False with fp16 loss scaling, whose
            overflow check must come before any exchange).
        pipeline: apply each step's exchange one step later (``train.pipeline_exchange``,
            NOTE [pipelined exchange] in comm/engine.py).
        probe: OMGS only: ``probe() -> loss`` on a representative batch; the merged-layer
            plan then comes from ``comm.omgs.plan_omgs`` (profile, fit, plan). Without it
            every layer is its own group (LAGS).
        layout: OMGS only: a saved ``state_dict()["layout"]`` to rebuild the same groups.
        momentum, masking, weight_decay, clip_norm: DGC's momentum correction (factor; 0 is
            off), momentum-factor masking, the weight decay per parameter it then adds and
            local gradient clipping (``comm.GradientExchanger``; NOTE [local update] in
            comm/local_update.py).
        dense_vectors: parameters of at most one dimension go densely (NOTE [dense
            vectors] in comm/plans/size.py; not ``omgs``, whose planner places every layer).

    Raises:
        ValueError: for an unknown name (lists the valid ones) or a bad density/selector.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        from trainer.config import COMM_NAMES

        if name not in COMM_NAMES:
            raise ValueError(f"unknown gradient exchange {name!r}; valid: {list(COMM_NAMES)}")
        return PhaseExchange(None)
    engine = {"momentum": momentum, "masking": masking, "weight_decay": weight_decay, "clip_norm": clip_norm,
              "overlap": overlap, "pipeline": pipeline}
    if name == "omgs":
        return _build_omgs(model, topology, density=density, selector=selector, probe=probe, layout=layout, **engine)
    from comm import GradientExchanger

    # NOTE [skipped steps keep residuals clean] in trainer.loop decides about overflow
    # before the exchange, so the exchanger's own check is off.
    return PhaseExchange(GradientExchanger([p for p in model.parameters() if p.requires_grad], name, topology,
                                           density=density, selector=selector, error_feedback=True,
                                           skip_nonfinite=False, hybrid_threshold_bytes=hybrid_bytes,
                                           dense_vectors=dense_vectors, **engine))


class DDPExchange:
    """Exchange inside backward: DDP's bucketed all-reduce, or a ``comm`` sparse comm hook.

    ``synchronize()`` has nothing left to do (DDP has averaged ``p.grad`` when backward
    returns), so communication that backward does not hide shows up in ``compute``.
    ``module`` is the DDP wrapper the forward pass must go through.
    """

    def __init__(self, module: nn.Module, hook_state=None):
        self.module, self.hook_state = module, hook_state
        self.last_timings = {"compress": 0.0, "communicate": 0.0}

    def synchronize(self) -> bool:
        return True

    def flush(self) -> bool:
        return False

    def state_dict(self) -> dict:
        return self.hook_state.state_dict() if self.hook_state is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.hook_state is not None and state:
            self.hook_state.load_state_dict(state)

    def take_residuals(self) -> dict:
        """What the hook's exchange still owes, per parameter (NOTE [residual at a phase switch])."""
        return self.hook_state.take_residuals() if self.hook_state is not None else {}

    def carry_in(self, residuals: dict) -> None:
        if residuals:
            self.hook_state.carry_in(residuals)

    def _hook_exchangers(self) -> list:
        return list(getattr(self.hook_state, "exchangers", {}).values())

    def take_inter_node_bytes(self) -> int:
        """Bytes the sparse hook's exchangers sent to other nodes since the last call;
        DDP's own all-reduce and the PowerSGD hook are not counted (0)."""
        from comm.collectives.base import take_inter_node_bytes

        return take_inter_node_bytes(self._hook_exchangers())

    def residual_sq(self) -> float:
        from comm.collectives.base import residual_sq

        return residual_sq(self._hook_exchangers())

    def set_density(self, density: float) -> None:
        """Density of the sparse hook's buckets from the next step on (density warm-up);
        buckets the hook builds later take it too."""
        from comm.collectives.base import set_density

        density = set_density(self._hook_exchangers(), density)
        if hasattr(self.hook_state, "exchangers"):
            self.hook_state.density = density

    def close(self) -> None:
        self.module = self.hook_state = None  # drops the reducer and its autograd hooks


def build_ddp_exchange(name: str, model: nn.Module, topology, *, density: float, selector: str,
                       carry: bool = False, powersgd_rank: int = 2) -> DDPExchange:
    """Wrap ``model`` in DDP; ``powersgd`` runs torch's PowerSGD hook (``comm.powersgd``,
    rank ``powersgd_rank``); algorithms other than ``dense`` run as ``comm.register_sparse_hook``
    (asynchronous), and so does ``dense`` when ``carry`` (a residual from the previous phase
    to apply: NOTE [residual at a phase switch] in comm/engine.py).

    Raises:
        ValueError: for ``omgs`` (it has its own backward pipeline: use the standalone
            exchanger) or an unknown name.
    """
    if name == "omgs":
        raise ValueError("--comm omgs pipelines its own exchange with backward; run it without --ddp")
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [next(model.parameters()).device.index] if next(model.parameters()).is_cuda else None
    ddp = DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)
    if name == "dense" and not carry:
        return DDPExchange(ddp)
    if name == "powersgd":
        from comm.powersgd import register_powersgd_hook

        return DDPExchange(ddp, register_powersgd_hook(ddp, rank=powersgd_rank))
    from comm import register_sparse_hook

    return DDPExchange(ddp, register_sparse_hook(ddp, name, topology, density=density, selector=selector))


def saved_residuals(phase, model: nn.Module, topology, state: dict, momentum: float = 0.0,
                    comm: str | None = None) -> dict:
    """The residuals a checkpoint's exchanger ``state`` holds for its own ``phase``, per
    parameter: what a run resuming into a later phase carries into it, as an uninterrupted
    run does at the phase switch (NOTE [residual at a phase switch] in comm/engine.py).
    The ``--ddp`` hook's residuals are not recovered (the caller passes nothing then).
    ``momentum``: the phase's momentum correction factor (0 if it had none); ``comm``: the
    algorithm that ran (default ``phase.comm``; what ``auto`` chose)."""
    if not state.get("exchange"):
        return {}
    saved = build_exchange(comm or phase.comm, model, topology, density=phase.density, selector=phase.selector,
                           overlap=False, hybrid_bytes=phase.hybrid_bytes, layout=state.get("layout"),
                           momentum=momentum, dense_vectors=phase.dense_vectors)
    try:
        saved.load_state_dict(state)
        return saved.take_residuals()
    finally:
        saved.close()
