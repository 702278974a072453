"""Optimiser, loss and mixed-precision set-up from a recipe's ``optim`` / ``train`` sections."""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
from torch import nn

from trainer.config import OptimConfig
from trainer.lars import LARS, split_param_groups

__all__ = ["build_optimizer", "peak_lr", "autocast_for", "make_scaler", "exchange_momentum", "take_momentum",
           "decay_of"]


def peak_lr(cfg: OptimConfig, global_batch: int) -> float:
    """``cfg.lr`` scaled linearly by ``global_batch / 256`` when ``cfg.scale_lr``."""
    return cfg.lr * global_batch / 256 if cfg.scale_lr else cfg.lr


def build_optimizer(cfg: OptimConfig, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """SGD with momentum or LARS; biases and BN parameters never get weight decay (Jizhi).

    With ``cfg.pto`` and more than one rank, LARS trust ratios are computed by the
    parallel tensor operator (``comm.pto.parallel_scalars``).
    """
    groups = split_param_groups(model, cfg.weight_decay)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
    ratio_fn = None
    if cfg.pto and dist.is_initialized() and dist.get_world_size() > 1:
        from comm.pto import parallel_scalars

        gather_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
        ratio_fn = lambda op, items: parallel_scalars(op, items, device=gather_device)  # noqa: E731
    return LARS(groups, lr=cfg.lr, momentum=cfg.momentum, eta=cfg.eta, ratio_fn=ratio_fn)


def autocast_for(amp: str, device: torch.device):
    """A context manager for the forward pass: bf16/fp16 autocast on CUDA, FP32 elsewhere."""
    if device.type != "cuda" or amp == "off":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return functools.partial(torch.autocast, device_type="cuda", dtype=dtype)


def make_scaler(amp: str, device: torch.device):
    """A ``GradScaler`` for fp16 on CUDA, else None (bf16 and FP32 need no loss scaling)."""
    if device.type == "cuda" and amp == "fp16":
        return torch.amp.GradScaler("cuda")
    return None


# NOTE [optimiser under momentum correction]: when the exchange applies DGC's momentum
# correction (NOTE [momentum correction] in comm/residual.py) ``p.grad`` after the
# exchange is the momentum-corrected update ``U`` (weight decay included), so the step
# must not add momentum or weight decay again: every group gets ``momentum = 0`` and
# ``weight_decay = 0`` (the recipe's values stay in ``base_momentum`` and
# ``base_weight_decay``) and ``momentum_in_grad = True``. SGD then does
# ``w -= lr * U`` (the same operations as torch's momentum step on its buffer, hence
# bit-identical to dense momentum SGD at density 1). LARS computes its trust ratios from
# the applied update, ``eta * ||w|| / ((1 - m) * ||U||)``, through the same ``ratio_fn``
# (PTO unchanged), and does ``w -= lr * trust * U``: for a steady gradient ``d``,
# ``U -> d / (1 - m)`` and the step equals LARS's steady momentum step. Flags and base
# values live in the optimiser's ``param_groups``, so checkpoints carry them.


def exchange_momentum(optimizer: torch.optim.Optimizer, on: bool) -> None:
    """Let the exchange apply momentum and weight decay (``on``) or the optimiser (NOTE
    [optimiser under momentum correction])."""
    for group in optimizer.param_groups:
        group.setdefault("base_momentum", group["momentum"])
        group.setdefault("base_weight_decay", group["weight_decay"])
        group["momentum_in_grad"] = bool(on)
        group["momentum"] = 0.0 if on else group["base_momentum"]
        group["weight_decay"] = 0.0 if on else group["base_weight_decay"]


def decay_of(optimizer: torch.optim.Optimizer) -> dict:
    """Parameter -> the recipe's weight decay (what the exchange adds under momentum correction)."""
    return {p: g.get("base_weight_decay", g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}


def take_momentum(optimizer: torch.optim.Optimizer) -> dict:
    """Clear the optimiser's momentum buffers at a switch into or out of momentum
    correction; return SGD's as ``m * buf`` per parameter (gradient units: added to the
    next gradient it continues that momentum exactly). LARS's buffers hold parameter
    units (``lr * trust`` folded in) and are dropped."""
    out = {}
    for group in optimizer.param_groups:
        m = group.get("base_momentum", group["momentum"])
        for p in group["params"]:
            buf = optimizer.state.get(p, {}).pop("momentum_buffer", None)
            if buf is not None and not isinstance(optimizer, LARS) and m:
                out[p] = buf * m
    return out
