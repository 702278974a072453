"""Residual memory for error feedback: what a sparse exchange did not apply is kept and
added back to the next step's input (the ``Gg_i = Gg_{i-1} + grad`` of the gTop-k paper),
optionally with DGC's momentum correction and momentum-factor masking.

NOTE [momentum correction]: Deep Gradient Compression (Lin et al., ICLR 2018, eqs. 5-7)
keeps the momentum *before* the sparse exchange, per worker:

    u = m * u + g          (local momentum, gradient units; g already holds weight decay)
    v = v + u              (the residual accumulates the momentum-corrected update)
    send top-k of v;  v[sent] = 0;  u[sent] = 0   (momentum-factor masking)

and the optimiser applies the exchanged average ``w -= lr * avg(sent v)`` without momentum
or weight decay of its own (``trainer.optim.exchange_momentum``). Without the correction
a residual entry sent after ``T`` steps arrives as one gradient that momentum then spreads
over the following steps: the delayed part is amplified and late, which is what costs
accuracy at density 0.01. At density 1 nothing stays in ``v`` and every worker's ``u``
sums to dense momentum SGD's buffer, so the correction alone (no masking) *is* dense
momentum SGD (tested bit-identical on CPU). Masking clears the momentum of sent entries
so that a stale momentum does not keep pushing an entry the update already moved (DGC
section 3.2); at density 1 it turns momentum off, so it is a separate switch.
Per algorithm (what "sent" means):

- ``topk_ag``: the worker's own top-k (all of it is applied).
- ``hitopk``: the selection runs on node sums, so the momentum lives there too, beside
  the node-level residual (NOTE [hitopk error feedback]): worker ``j`` keeps ``U`` for
  chunk ``j`` of ``sum(u over the node)``. The reduce-scatter is linear, so
  ``U = m * U + sum(g over the node)`` equals summing every worker's own ``u``, and
  masking ``U`` at the node's selection equals every worker of the node masking its
  ``u`` there: exact, with ``d/n`` momentum per worker instead of ``d``.
- ``gtopk``: the worker's local selections that made the global top-k; a local
  selection that missed it goes back into ``v`` (Algorithm 4 line 10) and keeps its
  momentum. The extra residuals (partial sums a merge dropped, wire rounding) are update
  units already and join ``v`` as before; they never touch ``u``.
- dense buckets of a corrected exchange (the ``size`` plan's hybrid choice): the local
  momentum is kept and sent whole, which equals momentum after the all-reduce.

NOTE [momentum masking]: masking is Deep Gradient Compression's, and this module keeps it
as a switch (on by default here, as published), but the trainer's phases leave it off
(``PhaseConfig.momentum_masking``). Without it a corrected exchange is dense momentum SGD
with each entry's updates delayed until it is sent: every ``u`` lands in ``v`` and is
applied once. With it an entry sent every ``T`` steps gets ``sum_{t<=T} (1 - m^t) / (1 - m)``
of momentum SGD's ``T / (1 - m)`` over that time: 91 % at ``T = 100`` but 23 % at ``T = 4``
(``m = 0.9``), so the entries sent most often, the largest, and every entry during a density
warm-up (25 % at its start) move at a fraction of the learning rate. On short runs, where
the warm-up is a large part of the run, that cost 1-2 points of top-1 on CIFAR-10 and
made a longer warm-up hurt instead of help (docs/benchmarks/history/train.md, issue 30).

Conservation then holds in update units: ``sum(u fed into v) + sum(old v) ==
P * output + sum(new v)``. What a corrected exchange still owes at a phase switch is
``m * u + (1 - m) * v`` in gradient units (:meth:`ResidualMemory.owed`): added to the next
gradient of an exchange with plain optimiser momentum, ``m * u`` continues the momentum
exactly and ``(1 - m) * v``, spread by that momentum, applies ``v`` once in total.
"""
from __future__ import annotations

import torch

__all__ = ["ResidualMemory"]


class ResidualMemory:
    """One residual buffer (fp32, or fp64 for fp64 inputs) for one tensor or fused bucket.

    Args:
        enabled: ``False`` turns error feedback off: ``compensate`` returns the input (or
            its momentum) without residual and ``update`` forgets.
        momentum: DGC momentum correction factor ``m`` (NOTE [momentum correction]);
            0 (default) turns it off.
        masking: with momentum correction, clear the momentum of sent entries
            (:meth:`mask`); default True.

    Raises:
        ValueError: for a momentum outside [0, 1).

    Example:
        >>> mem = ResidualMemory()
        >>> acc = mem.compensate(torch.ones(3))   # ones + residual (zeros at first)
        >>> mem.update(acc - acc.round())         # keep what was not applied
    """

    def __init__(self, enabled: bool = True, momentum: float = 0.0, masking: bool = True):
        if not 0.0 <= float(momentum) < 1.0:
            raise ValueError(f"momentum correction factor must be in [0, 1); got {momentum}")
        self.enabled = bool(enabled)
        self.factor, self.masking = float(momentum), bool(masking)
        self.residual: torch.Tensor | None = None
        self.momentum: torch.Tensor | None = None
        self._pending, self._in_flight = 1.0, False  # a rescale waiting for the next update (rescale)

    def correct(self, x: torch.Tensor) -> torch.Tensor:
        """``u = m * u + x`` in accumulation precision; returns ``u`` itself (do not
        write), or ``x`` unchanged when momentum correction is off."""
        if not self.factor:
            return x
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        if self.momentum is None:
            self.momentum = x.to(dtype=dtype, copy=True)  # torch.optim.SGD's first step: buf = g
        elif self.momentum.numel() != x.numel():
            raise ValueError(f"momentum holds {self.momentum.numel()} elements but the input has {x.numel()}: "
                             "one ResidualMemory serves one tensor layout")
        else:
            self.momentum = self.momentum.to(device=x.device, dtype=dtype)  # a loaded state is on the CPU
            self.momentum.mul_(self.factor).add_(x)
        return self.momentum

    def compensate(self, x: torch.Tensor, *, inplace: bool = False) -> torch.Tensor:
        """Return ``x + residual`` in accumulation precision (fp32, or fp64 for fp64 ``x``);
        with momentum correction, ``correct(x) + residual``.

        With error feedback on, the result is the caller's to turn into the next residual
        (:meth:`update`): ``x`` itself when ``inplace`` and ``x`` already has the accumulation
        dtype, else the stored residual's own buffer (which this memory then no longer
        holds), or a new tensor on the first call; with it off, ``x`` may be returned as is
        (do not write).

        Raises:
            ValueError: if ``x`` does not match the size of the stored residual.
        """
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        if self.factor:
            x, inplace = self.correct(x), False  # u stays ours: never hand it out to be written
        if not self.enabled:
            return x.to(dtype, copy=bool(self.factor))
        self._in_flight = True  # until update() stores the next residual
        res = self.residual
        if res is not None and res.numel() != x.numel():
            raise ValueError(f"residual holds {res.numel()} elements but the input has "
                             f"{x.numel()}: one ResidualMemory serves one tensor layout")
        if inplace and x.dtype == dtype:
            return x if res is None else x.add_(res.to(device=x.device, dtype=dtype))
        if res is None:
            return x.to(dtype=dtype, copy=True)
        # the residual's own buffer accumulates: no new tensor of the input's size per step
        # (NOTE [exchange working memory] in comm/collectives/base.py)
        acc = res if res.device == x.device and res.dtype == dtype else res.to(device=x.device, dtype=dtype, copy=True)
        self.residual = None  # handed out: the caller stores the next one with update()
        return acc.add_(x)

    @property
    def masks(self) -> bool:
        """Whether :meth:`mask` does anything (momentum correction with masking)."""
        return bool(self.factor and self.masking)

    def mask(self, indices: torch.Tensor) -> None:
        """Momentum-factor masking: clear the momentum at ``indices`` (the entries sent)."""
        if self.masks and self.momentum is not None:
            self.momentum[indices] = 0

    def update(self, residual: torch.Tensor) -> None:
        """Store ``residual`` (taken, not copied) as what is left for the next step."""
        self.residual = residual if self.enabled else None
        if self._pending != 1.0 and self.residual is not None:
            self.residual.mul_(self._pending)
        self._pending, self._in_flight = 1.0, False

    def owed(self) -> torch.Tensor | None:
        """What is still owed, in gradient units (NOTE [momentum correction]): the
        residual, or ``m * u + (1 - m) * v`` with momentum correction; None if nothing."""
        if not self.factor:
            return self.residual
        if self.momentum is None:
            return None if self.residual is None else self.residual * (1 - self.factor)
        out = self.momentum * self.factor
        if self.residual is not None:
            out.add_(self.residual.to(out.device), alpha=1 - self.factor)
        return out

    def rescale(self, factor: float) -> None:
        """Multiply the residual by ``factor`` (NOTE [residuals follow the learning rate]
        in comm/collectives/base.py); the momentum is left as it is. While the residual is
        handed out (an exchange in flight), the next one :meth:`update` stores takes it."""
        if self._in_flight:
            self._pending *= factor
        elif self.residual is not None:
            self.residual.mul_(factor)

    def clear(self) -> None:
        """Forget the residual and the momentum (after :meth:`owed` was handed on)."""
        self.residual = self.momentum = None
        self._pending, self._in_flight = 1.0, False

    def norm(self) -> float:
        """L2 norm of the residual (0 when there is none)."""
        return 0.0 if self.residual is None else float(self.residual.float().norm())

    def state_dict(self) -> dict:
        def cpu(t):
            return None if t is None else t.detach().to("cpu", copy=True)

        return {"enabled": self.enabled, "residual": cpu(self.residual), "factor": self.factor,
                "momentum": cpu(self.momentum)}

    def load_state_dict(self, state: dict) -> None:
        residual, momentum = state.get("residual"), state.get("momentum")
        self.residual = None if residual is None or not self.enabled else residual.clone()
        self.momentum = None if momentum is None or not self.factor else momentum.clone()
