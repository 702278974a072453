"""Weights and optimiser state put back after a look-ahead step.

NOTE [lookahead]: one step of staleness makes heavy-ball momentum ``mu`` stable only for
``lr * h < 1 - mu`` along a direction of curvature ``h``, against ``2 * (1 + mu)`` without
it (38x less at ``mu = 0.9``); the plain pipelined runs lost 20-57 points of top-1 after
their first epoch (docs/benchmarks/history/overlap.md, "Looking ahead"). So each pipelined step computes
its gradients at the weights the step still in flight will lead to, predicted with this
rank's own gradients of that step: before forward, ``GradientExchanger.lookahead_grads()``
puts them in ``p.grad`` and the optimiser takes its step (momentum, weight decay, LARS and
the learning rate of the step that applies the exchange); after backward the weights and
optimiser state are put back (:class:`WeightStash`, used by ``trainer/loop.py``) and the
exchanged average is applied as before. The weights stay the same on every rank and the
applied updates are those of the plain pipelined exchange; only where each rank evaluates
its gradient moves. With the same gradients on every rank (one batch, a dense exchange)
the run equals the synchronous one (tested); otherwise the prediction misses by the rank's
difference from the exchanged average (gradient noise, and what a sparse exchange holds
back), as the local step of Local SGD with delayed averaging does (DaSGD, Zhou et al.
2020), here without letting the ranks' weights drift apart. Under momentum correction
(sparse phases) the optimiser has no momentum (it lives in the exchange; masking, when
on, clears it where entries are sent), so the rank's gradient is the prediction of the
entries sent at every step. The
cost: one more optimiser step and a copy of the weights and optimiser state per step, and
the step's own inputs kept until the next step (one copy of the gradients).
"""
from __future__ import annotations

import copy
from collections.abc import Iterable

import torch

__all__ = ["WeightStash", "look_ahead"]


class WeightStash:
    """A copy of ``params`` and of their ``optimizer`` state, to take a step and undo it.

    Example:
        >>> stash = WeightStash(model.parameters(), optimizer)  # doctest: +SKIP
        >>> optimizer.step()      # the look-ahead step
        >>> ...                   # forward and backward at the predicted weights
        >>> stash.restore()       # weights and momentum exactly as before the step
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.params = list(params)
        self._weights = [p.detach().clone() for p in self.params]
        self._state = {p: {k: v.clone() if torch.is_tensor(v) else copy.deepcopy(v)
                           for k, v in optimizer.state[p].items()}
                       for p in self.params if p in optimizer.state}

    def restore(self) -> None:
        """Put back the weights (in place) and the optimiser state of the stashed parameters."""
        with torch.no_grad():
            for p, w in zip(self.params, self._weights):
                p.copy_(w)
        for p in self.params:
            if p in self._state:
                self.optimizer.state[p] = self._state[p]
            else:
                self.optimizer.state.pop(p, None)


def look_ahead(run, phase) -> WeightStash | None:
    """NOTE [lookahead]: with a pipelined exchange, step ``run`` (``trainer.loop``) to the
    weights the step still in flight will lead to, using this rank's own gradients of it;
    the returned stash puts weights and optimiser state back after backward (None: nothing
    to look ahead with)."""
    if not run.exchanger.lookahead_grads():
        return None
    stash = WeightStash(run.model.parameters(), run.optimizer)
    run._update(phase, True)
    return stash
