"""Validation: top-1 / top-5 accuracy and loss, summed across ranks."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from comm import collective_ops as ops

__all__ = ["evaluate", "topk_correct"]


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, ks=(1, 5)) -> list[int]:
    """Number of samples whose label is among the top-k logits, for each k."""
    top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
    hit = top == labels.view(-1, 1)
    return [int(hit[:, :k].any(dim=1).sum()) for k in ks]


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, autocast, channels_last: bool = False) -> dict:
    """Top-1 / top-5 (percent) and mean loss over the whole val split (all ranks' shards).

    Returns:
        ``{"val_top1", "val_top5", "val_loss", "val_images"}``, identical on every rank.
    """
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64)  # top1, top5, loss sum, images
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    loader.set_epoch(0)
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with autocast():
            logits = model(images)
        c1, c5 = topk_correct(logits.float(), labels)
        sums += torch.tensor([c1, c5, float(loss_fn(logits.float(), labels)), labels.numel()], dtype=torch.float64)
    if dist.is_initialized():
        on = sums.to(device) if dist.get_backend() == "nccl" else sums
        ops.all_reduce(on)
        sums = on.cpu()
    model.train()
    n = max(sums[3].item(), 1.0)
    return {"val_top1": 100.0 * sums[0].item() / n, "val_top5": 100.0 * sums[1].item() / n,
            "val_loss": sums[2].item() / n, "val_images": int(sums[3].item())}
