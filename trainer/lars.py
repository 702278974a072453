"""LARS (You et al. 2017) with FP32 trust ratios, as the Jizhi system uses it.

For a LARS parameter ``w`` with gradient ``g``, weight decay ``wd`` and coefficient ``eta``:

    trust = eta * ||w|| / (||g|| + wd * ||w|| + eps)      (1 if ||w|| or ||g|| is 0)
    v     = momentum * v + lr * trust * (g + wd * w)
    w     = w - v

Biases and BN parameters (every parameter with fewer than two dimensions) take neither
LARS nor weight decay: ``v = momentum * v + lr * g``. Norms are computed in FP32 from
FP32 copies whatever the parameter dtype (NOTE [LARS in FP32]: in FP16 the ratio leaves
the representable range and the update vanishes, Jizhi section 4.1).

With DGC momentum correction in the exchange (group key ``momentum_in_grad``) ``g`` is
the momentum-corrected update ``U`` and the step is ``w -= lr * trust * U`` with
``trust = eta * ||w|| / ((1 - m) * ||U||)`` (NOTE [optimiser under momentum correction]
in trainer/optim.py).

The trust ratios can be computed by the parallel tensor operator (``comm.pto``): each
rank computes its share of layers and one all-gather of scalars shares them.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

__all__ = ["LARS", "split_param_groups", "trust_ratios"]


def split_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weights (decay, LARS) and biases / BN parameters (no decay, no LARS).

    Raises:
        ValueError: for a negative weight decay.
    """
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0; got {weight_decay}")
    decay, plain = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim > 1 else plain).append(p)
    return [{"params": decay, "weight_decay": weight_decay, "lars": True},
            {"params": plain, "weight_decay": 0.0, "lars": False}]


def trust_ratios(pairs: Sequence[tuple[torch.Tensor, torch.Tensor, float]], eta: float,
                 eps: float) -> torch.Tensor:
    """FP32 LARS trust ratio per ``(weight, grad, weight_decay)`` triple (1-D tensor)."""
    if not pairs:
        return torch.zeros(0, dtype=torch.float32)
    w_norm = torch.stack([w.detach().float().norm() for w, _, _ in pairs])
    g_norm = torch.stack([g.detach().float().norm() for _, g, _ in pairs])
    wd = torch.tensor([d for _, _, d in pairs], dtype=torch.float32, device=w_norm.device)
    ratio = eta * w_norm / (g_norm + wd * w_norm + eps)
    return torch.where((w_norm > 0) & (g_norm > 0), ratio, torch.ones_like(ratio)).cpu()


class LARS(torch.optim.Optimizer):
    """SGD with momentum and layer-wise adaptive rate scaling.

    Args:
        params: parameters or groups (``split_param_groups``); a group with
            ``lars=False`` is updated as plain momentum SGD with its own weight decay.
        lr: base learning rate (the schedule sets ``group["lr"]``).
        momentum: momentum factor in ``[0, 1)``.
        weight_decay: default weight decay for groups that do not set it.
        eta: LARS coefficient (trust scale), > 0.
        eps: added to the denominator of the trust ratio.
        ratio_fn: ``ratio_fn(op, items) -> tensor`` that evaluates ``op`` over the LARS
            layers; default computes all locally. Pass ``functools.partial(
            comm.pto.parallel_scalars, group=...)`` to share the work across ranks (PTO).

    Raises:
        ValueError: for lr < 0, momentum outside [0, 1), eta <= 0 or negative weight decay.

    Example:
        >>> opt = LARS(split_param_groups(model, 5e-5), lr=0.1, eta=0.001)  # doctest: +SKIP
    """

    def __init__(self, params: Iterable, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 eta: float = 0.001, eps: float = 1e-9, ratio_fn: Callable | None = None):
        if lr < 0 or not 0 <= momentum < 1 or eta <= 0 or weight_decay < 0:
            raise ValueError(f"need lr >= 0, 0 <= momentum < 1, eta > 0, weight_decay >= 0; "
                             f"got {lr=}, {momentum=}, {eta=}, {weight_decay=}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, lars=True)
        super().__init__(params, defaults)
        self.eta, self.eps = eta, eps
        self.ratio_fn = ratio_fn or (lambda op, items: op(items))
        self.last_trust: torch.Tensor | None = None  # ratios of the latest step, for logging/tests

    def __getstate__(self):  # the ratio function may hold a process group: not picklable
        state = super().__getstate__()
        state.pop("ratio_fn", None)
        return state

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        """Apply one update; returns the closure's loss if one is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        lars_items = [(p, p.grad, g["weight_decay"]) for g in self.param_groups if g["lars"]
                      for p in g["params"] if p.grad is not None]
        ratios = self.ratio_fn(lambda items: trust_ratios(items, self.eta, self.eps), lars_items)
        self.last_trust = ratios
        ratio_of = {id(p): float(r) for (p, _, _), r in zip(lars_items, ratios.tolist())}
        for group in self.param_groups:
            lr, mom, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad.float()
                if wd:
                    d = d.add(p.detach().float(), alpha=wd)
                scale = lr * ratio_of[id(p)] if group["lars"] else lr
                if group["lars"] and group.get("momentum_in_grad"):  # NOTE [optimiser under momentum correction]
                    scale /= 1.0 - group["base_momentum"]
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
                buf.mul_(mom).add_(d, alpha=scale)
                p.sub_(buf.to(p.dtype))
        return loss
