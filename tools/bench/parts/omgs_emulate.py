"""A model with given parameter shapes whose backward SLEEPS given per-layer times.

NOTE [emulated backward]
Four workers share this 2-core machine, so a real ResNet-50 backward in each would time
CPU contention, not the pipeline. As on a GPU, where backward kernels leave the host CPU
free, each layer's backward here waits (``time.sleep``) the per-layer time measured on a
real ResNet-50 and then returns a fixed random gradient of the layer's shape. Gradients,
sparsification, error feedback and the all-gathers are all real; the hooks fire exactly
as in a real backward because the layers form one autograd chain.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["SleepChain"]


class _SleepLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, seconds, grad):
        ctx.seconds, ctx.grad = seconds, grad
        return x.clone()

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.seconds > 0:
            time.sleep(ctx.seconds)
        return grad_out, ctx.grad.clone(), None, None


class SleepChain(nn.Module):
    """``len(numels)`` flat parameters; layer i's backward sleeps ``seconds[i]``.

    Args:
        numels: parameter sizes in forward order.
        seconds: per-layer backward seconds in forward order.
        seed: seed of the fixed random gradients (differs per rank).
    """

    def __init__(self, numels: Sequence[int], seconds: Sequence[float], seed: int = 0):
        super().__init__()
        if len(numels) != len(seconds):
            raise ValueError("numels and seconds must have the same length")
        gen = torch.Generator().manual_seed(seed)
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(int(n))) for n in numels)
        self.grads = [torch.randn(int(n), generator=gen) for n in numels]
        self.seconds = [float(s) for s in seconds]

    def forward(self) -> torch.Tensor:
        x = torch.zeros(1)
        for w, s, g in zip(self.weights, self.seconds, self.grads):
            x = _SleepLayer.apply(x, w, s, g)
        return x.sum()
