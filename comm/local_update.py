"""What each worker does to a bucket's gradients before the engine exchanges it.

NOTE [local update]: the DGC options act on each worker's bucket before it is exchanged,
in this order: local gradient clipping (``clip_norm``: the bucket's L2 norm is clipped to
``clip_norm / sqrt(P)``, DGC section 3.3: summed over ``P`` workers with independent
noise the norms add in quadrature, so each worker gets its ``P**-1/2`` share of the
threshold; a one-bucket plan clips the worker's whole gradient, a plan of several
buckets clips each bucket on its own, as DGC's reference code clips each tensor), then
weight decay (``weight_decay``: ``wd * w`` added to the gradient, so that it goes through
the momentum correction as DGC does), then a residual carried from the previous phase,
then the exchanger's momentum correction and residual. Clipping comes before anything
enters the momentum or the residual, so a spike is cut before it is accumulated.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch

__all__ = ["LocalUpdate"]


class LocalUpdate:
    """Local clipping, weight decay and the carried residual of one rank (NOTE [local update]).

    Args:
        params: the engine's parameters; :meth:`apply` names them by index in this list.
        world_size: ``P``, the workers the exchange averages over.
        weight_decay: parameter -> weight decay added to its gradient; default none.
        clip_norm: clipping threshold before ``P**-1/2`` scaling; 0 (default) does not clip.

    Attributes:
        clip: the threshold each worker's bucket is clipped to (0: off).
        carried: parameter index -> residual carried from the previous phase, added to the
            next gradient of that parameter and then dropped (NOTE [residual at a phase
            switch] in comm/engine.py).

    Raises:
        ValueError: negative clip_norm or weight decay.
    """

    def __init__(self, params: list[torch.nn.Parameter], world_size: int,
                 weight_decay: Mapping[torch.Tensor, float] | None = None, clip_norm: float = 0.0):
        if clip_norm < 0 or any(wd < 0 for wd in (weight_decay or {}).values()):
            raise ValueError(f"clip_norm and weight decay must be >= 0; got {clip_norm=}")
        self.params = params
        decay = {id(p): float(wd) for p, wd in (weight_decay or {}).items()}
        self.decay = [decay.get(id(p), 0.0) for p in params]
        self.clip = float(clip_norm) / math.sqrt(world_size) if clip_norm else 0.0
        self.carried: dict[int, torch.Tensor] = {}

    def apply(self, params: list[int], flat: torch.Tensor) -> None:
        """Clip, add weight decay and the carried residual to ``flat`` (the bucket of
        parameters ``params``, concatenated) in place."""
        if self.clip:  # clip_grad_norm_'s coefficient, on the device: no host sync in backward's hooks
            norm = (flat if flat.dtype in (torch.float32, torch.float64) else flat.float()).norm()
            flat.mul_(torch.clamp(self.clip / (norm + 1e-6), max=1.0).to(flat.dtype))
        offset = 0
        for i in params:
            n = self.params[i].numel()
            if self.decay[i]:
                flat[offset:offset + n].add_(self.params[i].detach().reshape(-1), alpha=self.decay[i])
            carried = self.carried.pop(i, None)
            if carried is not None:
                flat[offset:offset + n] += carried.reshape(-1).to(device=flat.device, dtype=flat.dtype)
            offset += n
