"""The engine's residuals: handed over at a phase switch and kept in checkpoints, with the
pipelined step not applied yet (NOTE [pipelined exchange] in comm/engine.py).

NOTE [residual at a phase switch]: when training moves from one exchange to another
(``dawnbench28``: hitopk, then 2dtar), what the sparse exchange still owes is not
dropped: :meth:`~comm.GradientExchanger.take_residuals` hands every rank's residual back per
parameter and :meth:`~comm.GradientExchanger.carry_in` adds it to the next gradients the new
exchanger sends, so it is applied (averaged like a gradient) by the first exchange of the
new phase. Per rank, ``sum(gradients) + sum(residual taken) ==`` what the next exchanges
receive, and over all ranks nothing is lost. With momentum correction what is handed back
is ``m * u + (1 - m) * v`` (NOTE [momentum correction] in comm/residual.py).
"""
from __future__ import annotations

import torch

from comm.collectives import base
from comm.in_flight import StepFlights

__all__ = ["EngineResiduals"]


class EngineResiduals:
    """The residual side of :class:`comm.GradientExchanger` (a base class of it): works on
    its ``params``, ``buckets``, ``exchangers``, ``algorithm``, ``pipeline``, local update
    (``_local``) and pipelined step (``_previous``, finished by ``_drain()``)."""

    def take_inter_node_bytes(self) -> int:
        """Bytes this rank sent to other nodes since the last call (NOTE [inter-node
        bytes] in comm/link_bytes.py); the counters restart from zero."""
        return base.take_inter_node_bytes(self.exchangers)

    def residual_sq(self) -> float:
        """Sum of squares of this rank's residuals (update units under momentum correction)."""
        return base.residual_sq(self.exchangers)

    def rescale_residuals(self, factor: float) -> None:
        """Multiply this rank's residuals by ``factor`` (NOTE [residuals follow the learning
        rate] in comm/collectives/base.py): ``lr_prev / lr`` before a step whose rate changed.
        A residual held by an exchange in flight is rescaled when that exchange stores it."""
        base.rescale_residuals(self.exchangers, factor)

    def take_residuals(self) -> dict[torch.Tensor, torch.Tensor]:
        """This rank's residuals per parameter (parameter -> tensor shaped like it), cleared
        here (NOTE [residual at a phase switch]). Parameters without residual are left out.

        Raises:
            RuntimeError: with ``pipeline``, while gradients are in flight or not applied
                (:meth:`flush` first).
        """
        if self._previous is not None:
            raise RuntimeError("GradientExchanger.take_residuals() while a pipelined exchange is not applied: call "
                               "flush() and apply its gradients first (NOTE [pipelined exchange])")
        out = {}
        for b, ex in zip(self.buckets, self.exchangers):
            if ex.memory.residual is None and ex.memory.momentum is None:
                continue
            numel = sum(self.params[i].numel() for i in b.params)
            full = ex.placed_residual(numel)
            offset = 0
            for i in b.params:
                n = self.params[i].numel()
                out[self.params[i]] = full[offset:offset + n].view_as(self.params[i]).clone()
                offset += n
            ex.memory.clear()
        return out

    def carry_in(self, residuals: dict[torch.Tensor, torch.Tensor]) -> None:
        """Add ``residuals`` (parameter -> tensor, as :meth:`take_residuals` gives) to the
        next gradients this exchanger sends.

        Raises:
            ValueError: for a parameter this exchanger does not hold, or a wrong shape.
        """
        index = {id(p): i for i, p in enumerate(self.params)}
        for p, r in residuals.items():
            if id(p) not in index or r.shape != p.shape:
                raise ValueError(f"carried residual of shape {tuple(r.shape)} matches no parameter of this exchanger")
            self._local.carried[index[id(p)]] = r  # NOTE [residual at a phase switch]

    def state_dict(self) -> dict:
        """Residuals of every bucket (for checkpoints), with the bucket layout. With
        ``pipeline`` also the previous step's averaged gradients not applied yet (``pending``),
        so that a run resumed from a checkpoint takes the same steps as one that went on:
        an exchange still in flight is finished first (collective then; NOTE [pipelined
        exchange])."""
        state = {"algorithm": self.algorithm, "buckets": [list(b.params) for b in self.buckets],
                 "exchangers": [ex.state_dict() for ex in self.exchangers]}
        if self._previous is not None:
            self._drain()
            state["pending"] = self._previous.state()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore residuals (and a pipelined step's unapplied gradients) saved by :meth:`state_dict`.

        Raises:
            ValueError: if the bucket layout differs (other model or plan options), or the
                state holds unapplied gradients and this exchanger is not pipelined.
        """
        if [list(b.params) for b in self.buckets] != [list(b) for b in state["buckets"]]:
            raise ValueError("saved gradient buckets differ from this model's: use the same model, plan, "
                             "bucket_bytes and hybrid_threshold_bytes as when the state was saved")
        pending = state.get("pending")
        if pending is not None and not self.pipeline:
            raise ValueError("the saved exchange state holds the gradients of a pipelined step not applied yet: "
                             "resume with pipeline=True (train.pipeline_exchange), or from an epoch-end checkpoint")
        for ex, s in zip(self.exchangers, state["exchangers"]):
            ex.load_state_dict(s)
        self._previous = None if pending is None else StepFlights.from_state(pending, self.params[0].device)
