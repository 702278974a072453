"""A phase's gradient exchange as the training loop sees it: one declared interface
(:class:`Exchange`) and its two adapters, chosen by :func:`build_exchange` from what the
algorithm declares in :mod:`comm.registry`.

- :class:`EngineExchange`: the comm engine (``comm.GradientExchanger``), which starts each
  bucket's exchange during backward: fused buckets of the algorithm (``Algorithm.exchanger``)
  or the buckets an algorithm lays out itself (``Algorithm.build``: OMGS's merged layers).
- :class:`DDPExchange`: the model wrapped in DDP, exchanging inside backward: DDP's own
  all-reduce for the plain dense exchange, the algorithm's own hook for one that runs
  only in DDP (``Algorithm.ddp_hook``: PowerSGD) and ``comm.register_sparse_hook`` for
  the others (``--ddp``).
"""
from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn

from comm.registry import DENSE, get_algorithm
from comm.timings import ExchangeTimings

__all__ = ["LocalTopology", "topology_for", "Exchange", "EngineExchange", "DDPExchange", "build_exchange",
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


class Exchange(abc.ABC):
    """What the training loop asks of a phase's gradient exchange, whatever runs it.

    Attributes:
        module: what the forward pass goes through (the model, or its DDP wrapper).
        last_timings: the last :meth:`synchronize`'s :class:`comm.ExchangeTimings`.
    """

    module: nn.Module
    last_timings: ExchangeTimings = ExchangeTimings()

    @abc.abstractmethod
    def synchronize(self) -> bool:
        """Finish the step's exchange into ``p.grad`` (collective); False when there is
        nothing to apply (NOTE [pipelined exchange] in comm/engine.py)."""

    def lookahead_grads(self) -> bool:
        """This rank's own gradients of a pipelined step still in flight, into ``p.grad``
        (NOTE [lookahead] in trainer/lookahead.py); False when there are none."""
        return False

    def flush(self) -> bool:
        """Finish a pipelined exchange still in flight into ``p.grad``: True if there is one
        more optimiser step to take (collective)."""
        return False

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """What a checkpoint keeps of the exchange (residuals)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved."""

    @abc.abstractmethod
    def take_residuals(self) -> dict:
        """What the exchange still owes, per parameter, cleared here (NOTE [residual at a
        phase switch] in comm/engine_residuals.py)."""

    @abc.abstractmethod
    def carry_in(self, residuals: dict) -> None:
        """Add ``residuals`` (as :meth:`take_residuals` gives) to the next gradients sent."""

    @abc.abstractmethod
    def set_density(self, density: float) -> None:
        """Density of the sparse buckets from the next step on (density warm-up)."""

    @abc.abstractmethod
    def rescale_residuals(self, factor: float) -> None:
        """Multiply the residuals by ``factor`` (NOTE [residuals follow the learning rate]
        in comm/collectives/base.py); an exchange without residuals ignores it."""

    @abc.abstractmethod
    def take_inter_node_bytes(self) -> int:
        """Bytes this rank sent to other nodes since the last call (NOTE [inter-node bytes]
        in comm/link_bytes.py)."""

    @abc.abstractmethod
    def residual_sq(self) -> float:
        """Sum of squares of this rank's residuals."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release hooks and wrappers."""


class EngineExchange(Exchange):
    """The comm engine as an :class:`Exchange`.

    Args:
        module: the model.
        inner: a ``comm.GradientExchanger``, or None on a single process (nothing to exchange).
        layout: what rebuilds the same buckets on resume (``Algorithm.build``'s layout).
    """

    def __init__(self, module: nn.Module, inner=None, layout: dict | None = None):
        self.module, self.inner, self.layout = module, inner, layout or {}

    def synchronize(self) -> bool:
        if self.inner is None:
            return True
        applied = self.inner.synchronize()
        self.last_timings = self.inner.last_timings
        return applied

    def lookahead_grads(self) -> bool:
        return self.inner is not None and self.inner.lookahead_grads()

    def flush(self) -> bool:
        return self.inner is not None and self.inner.flush()

    def state_dict(self) -> dict:
        """Residuals, plus the layout (OMGS layer order and plan) needed to rebuild alike."""
        return {"exchange": self.inner.state_dict() if self.inner is not None else {}, "layout": self.layout}

    def load_state_dict(self, state: dict) -> None:
        if self.inner is not None and state.get("exchange"):
            self.inner.load_state_dict(state["exchange"])

    def take_residuals(self) -> dict:
        return self.inner.take_residuals() if self.inner is not None else {}

    def carry_in(self, residuals: dict) -> None:
        if self.inner is not None and residuals:
            self.inner.carry_in(residuals)

    def set_density(self, density: float) -> None:
        if self.inner is not None:
            self.inner.set_density(density)

    def rescale_residuals(self, factor: float) -> None:
        if self.inner is not None:
            self.inner.rescale_residuals(factor)

    def take_inter_node_bytes(self) -> int:
        return self.inner.take_inter_node_bytes() if self.inner is not None else 0

    def residual_sq(self) -> float:
        return self.inner.residual_sq() if self.inner is not None else 0.0

    def close(self) -> None:
        if self.inner is not None:
            self.inner.remove()


class DDPExchange(Exchange):
    """DDP as an :class:`Exchange`: its bucketed all-reduce, or a comm hook (``hook_state``).

    ``synchronize()`` has nothing left to do (DDP has averaged ``p.grad`` when backward
    returns), so communication that backward does not hide shows up in ``compute``.
    """

    def __init__(self, module: nn.Module, hook_state=None):
        self.module, self.hook_state = module, hook_state

    def synchronize(self) -> bool:
        return True

    def state_dict(self) -> dict:
        return self.hook_state.state_dict() if self.hook_state is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.hook_state is not None and state:
            self.hook_state.load_state_dict(state)

    def take_residuals(self) -> dict:
        return self.hook_state.take_residuals() if self.hook_state is not None else {}

    def carry_in(self, residuals: dict) -> None:
        if residuals:
            self.hook_state.carry_in(residuals)

    def _hook_exchangers(self) -> list:
        return list(getattr(self.hook_state, "exchangers", {}).values())

    def rescale_residuals(self, factor: float) -> None:
        """The sparse hook's residuals; DDP's all-reduce has none and the PowerSGD hook's
        error feedback is torch's own state, left in gradient units."""
        from comm.collectives.base import rescale_residuals

        rescale_residuals(self._hook_exchangers(), factor)

    def take_inter_node_bytes(self) -> int:
        """The sparse hook's; DDP's own all-reduce and the PowerSGD hook are not counted (0)."""
        from comm.collectives.base import take_inter_node_bytes

        return take_inter_node_bytes(self._hook_exchangers())

    def residual_sq(self) -> float:
        from comm.collectives.base import residual_sq

        return residual_sq(self._hook_exchangers())

    def set_density(self, density: float) -> None:
        """Buckets the sparse hook builds later take it too."""
        from comm.collectives.base import set_density

        density = set_density(self._hook_exchangers(), density)
        if hasattr(self.hook_state, "exchangers"):
            self.hook_state.density = density

    def close(self) -> None:
        self.module = self.hook_state = None  # drops the reducer and its autograd hooks


def build_exchange(comm: str, model: nn.Module, topology, phase, *, ddp: bool = False, overlap: bool = True,
                   pipeline: bool = False, probing=None, layout: dict | None = None, momentum: float = 0.0,
                   weight_decay: dict | None = None, clip_norm: float = 0.0, carry: bool = False) -> Exchange:
    """The exchange of algorithm ``comm`` for ``phase`` (its density, selector, bucket and
    DGC settings, and its ``options`` when ``phase.comm`` is ``comm``; else, as when
    ``auto`` chose ``comm``, the algorithm's default options).

    Args:
        ddp: exchange inside DDP's backward (``--ddp``); an algorithm that runs only as a
            DDP hook always does.
        overlap: exchange during backward (False with fp16 loss scaling, whose overflow
            check must come before any exchange).
        pipeline: apply each step's exchange one step later (``train.pipeline_exchange``,
            NOTE [pipelined exchange] in comm/engine.py).
        probing: ``probing() -> context manager yielding probe() -> loss``, entered around
            an algorithm's own ``build`` (OMGS plans from profiling backward on it).
        layout: a saved ``state_dict()["layout"]``, to rebuild the same buckets.
        momentum, weight_decay, clip_norm: DGC's momentum correction (factor; 0 is off),
            the weight decay per parameter it then adds and local gradient clipping
            (NOTE [local update] in comm/local_update.py).
        carry: a residual from the previous phase will be carried in (DDP then runs the
            dense exchange as a comm hook, which can add it).

    Raises:
        ValueError: for an unknown algorithm (lists the registered ones), a bad density or
            selector, or ``ddp`` with an algorithm that lays out its own buckets.
    """
    algorithm = get_algorithm(comm)
    options = phase.options if phase.comm == comm else algorithm.options()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return EngineExchange(model)
    if ddp or algorithm.inside_ddp:
        return _ddp_exchange(algorithm, options, model, topology, phase, carry)
    # NOTE [skipped steps keep residuals clean] in trainer.loop decides about overflow
    # before the exchange, so the exchanger's own check is off.
    engine = {"density": phase.sparse_density, "selector": phase.selector, "momentum": momentum,
              "masking": phase.momentum_masking, "weight_decay": weight_decay, "clip_norm": clip_norm,
              "overlap": overlap, "pipeline": pipeline, "skip_nonfinite": False}
    if algorithm.build is not None:
        with probing() if probing is not None else _no_probe() as probe:
            inner, layout = algorithm.build(model, topology, options, probe=probe, layout=layout, **engine)
        return EngineExchange(model, inner, layout)
    from comm import GradientExchanger, SizePlan

    plan = SizePlan(hybrid_threshold_bytes=phase.hybrid_bytes, dense_vectors=phase.dense_vectors)
    return EngineExchange(model, GradientExchanger([p for p in model.parameters() if p.requires_grad], comm,
                                                   topology, plan=plan, options=options, **engine))


def _ddp_exchange(algorithm, options, model: nn.Module, topology, phase, carry: bool) -> DDPExchange:
    """Wrap ``model`` in DDP with ``algorithm``'s hook; the plain dense exchange without a
    residual to carry (NOTE [residual at a phase switch] in comm/engine_residuals.py) is DDP's own."""
    if algorithm.build is not None:
        raise ValueError(f"--comm {algorithm.name} lays out its own buckets and pipelines them with backward; "
                         "run it without --ddp")
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [next(model.parameters()).device.index] if next(model.parameters()).is_cuda else None
    ddp = DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)
    if algorithm.ddp_hook is not None:
        return DDPExchange(ddp, algorithm.ddp_hook(ddp, options))
    if algorithm.name == DENSE and not carry:
        return DDPExchange(ddp)
    from comm import register_sparse_hook

    return DDPExchange(ddp, register_sparse_hook(ddp, algorithm.name, topology, density=phase.sparse_density,
                                                 selector=phase.selector, options=options))


@contextlib.contextmanager
def _no_probe():
    yield None


def saved_residuals(phase, model: nn.Module, topology, state: dict, momentum: float = 0.0,
                    comm: str | None = None) -> dict:
    """The residuals a checkpoint's exchange ``state`` holds for its own ``phase``, per
    parameter: what a run resuming into a later phase carries into it, as an uninterrupted
    run does at the phase switch (NOTE [residual at a phase switch] in comm/engine_residuals.py).
    The ``--ddp`` hook's residuals are not recovered (the caller passes nothing then).
    ``momentum``: the phase's momentum correction factor (0 if it had none); ``comm``: the
    algorithm that ran (default ``phase.comm``; what ``auto`` chose)."""
    if not state.get("exchange"):
        return {}
    saved = build_exchange(comm or phase.comm, model, topology, phase, overlap=False, layout=state.get("layout"),
                           momentum=momentum)
    try:
        saved.load_state_dict(state)
        return saved.take_residuals()
    finally:
        saved.close()
