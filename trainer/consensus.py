"""``agree``: every rank learns whether a step succeeded everywhere, and why not.

NOTE [failing together]: a rank that fails alone (its checkpoint file cannot be written,
its ``--out`` check refuses) and raises would leave the other ranks waiting in their next
collective until a timeout, or for ever. So such steps end with ``agree(ok, error)``: one
all-gather of a fixed-size status (a flag and the error text, UTF-8, cut to
``MESSAGE_BYTES``) after which every rank raises the same ``RankFailed`` naming the
failed ranks and their errors, or all go on. Nothing is pickled.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from comm import collective_ops as ops

__all__ = ["MESSAGE_BYTES", "RankFailed", "agree"]

MESSAGE_BYTES = 480


class RankFailed(RuntimeError):
    """A step failed on one or more ranks; ``failures`` maps rank to its error text."""

    def __init__(self, failures: dict[int, str]):
        self.failures = failures
        super().__init__("; ".join(f"rank {r}: {msg}" for r, msg in sorted(failures.items())))


def _status(ok: bool, error: str) -> torch.Tensor:
    status = torch.zeros(1 + MESSAGE_BYTES, dtype=torch.uint8)
    if not ok:
        text = (error or "failed").encode()[:MESSAGE_BYTES]
        status[0] = 1
        status[1: 1 + len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    return status


def agree(ok: bool, error: str = "", device: torch.device | None = None) -> None:
    """Collective: return if ``ok`` on every rank, else raise ``RankFailed`` on every rank.

    Args:
        ok: whether the step succeeded on this rank.
        error: why not (one line; names the file or flag).
        device: where NCCL collectives run (CUDA); ignored with gloo or without a group.

    Raises:
        RankFailed: on every rank, when any rank passed ``ok=False``.
    """
    status = _status(ok, error)
    if dist.is_initialized() and dist.get_world_size() > 1:
        on = status.to(device) if device is not None and dist.get_backend() == "nccl" else status
        gathered = [torch.zeros_like(on) for _ in range(dist.get_world_size())]
        ops.all_gather_list(gathered, on)
        statuses = [g.cpu() for g in gathered]
    else:
        statuses = [status]
    failures = {r: bytes(s[1:].tolist()).rstrip(b"\0").decode(errors="replace")
                for r, s in enumerate(statuses) if s[0]}
    if failures:
        raise RankFailed(failures)
