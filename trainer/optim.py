"""Optimiser, loss and mixed-precision set-up from a recipe's ``optim`` / ``train`` sections."""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
from torch import nn

from trainer.config import OptimConfig
from trainer.lars import LARS, split_param_groups

__all__ = ["build_optimizer", "peak_lr", "autocast_for", "make_scaler"]


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
