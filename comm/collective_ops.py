"""Every collective of ``comm`` goes through here: the tensor's device is checked against
the group's backend first, so a CPU tensor on an NCCL group fails at once with a message
instead of hanging (NOTE [device check]).

The functions mirror ``torch.distributed`` (same arguments, ``group=None`` is the
default group) and return what it returns: ``None``, or a ``Work`` with ``async_op=True``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["DeviceMismatchError", "check_device", "all_reduce", "all_gather_into", "all_gather_list",
           "reduce_scatter_into", "reduce", "broadcast", "isend", "irecv", "barrier"]

_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class DeviceMismatchError(ValueError):
    """A tensor on a device that the process group's backend cannot carry."""


def device_error(device: torch.device, backend: str, op: str) -> str | None:
    """Why ``backend`` cannot run ``op`` on a tensor on ``device`` (None when it can).

    NOTE [device check]: NCCL carries CUDA tensors only; handed a CPU tensor it may wait
    forever for peers that never join the kernel. gloo carries CPU tensors (and CUDA ones
    for some operations); other device types (meta, mps, ...) go nowhere. A mixed group
    (``"cpu:gloo,cuda:nccl"``) carries both CPU and CUDA tensors.
    """
    backend = str(backend).lower()
    kinds = {part.split(":")[0] for part in backend.split(",")} if ":" in backend else set()
    if backend == "nccl" and device.type != "cuda":
        return (f"{op}: tensor on {device} but the process group's backend is nccl, which carries CUDA "
                "tensors only; move the tensor to the topology's device (comm.Topology.device) or use a "
                "gloo group")
    if device.type not in ("cpu", "cuda") or (kinds and device.type not in kinds):
        return f"{op}: tensor on {device} cannot travel over a {backend} process group; use cpu or cuda tensors"
    return None


def check_device(tensor: torch.Tensor, group=None, op: str = "collective") -> None:
    """Raise :class:`DeviceMismatchError` if ``group``'s backend cannot carry ``tensor``."""
    why = device_error(tensor.device, dist.get_backend(group), op)
    if why is not None:
        raise DeviceMismatchError(why)


def all_reduce(t: torch.Tensor, op=dist.ReduceOp.SUM, group=None, async_op: bool = False):
    check_device(t, group, "all_reduce")
    return dist.all_reduce(t, op=op, group=group, async_op=async_op)


def all_gather_into(out: torch.Tensor, t: torch.Tensor, group=None, async_op: bool = False):
    """All-gather equal-sized tensors into ``out`` (rank order)."""
    check_device(t, group, "all_gather")
    return _ALL_GATHER(out, t.contiguous(), group=group, async_op=async_op)


def all_gather_list(outs: list[torch.Tensor], t: torch.Tensor, group=None, async_op: bool = False):
    check_device(t, group, "all_gather")
    return dist.all_gather(outs, t, group=group, async_op=async_op)


def reduce_scatter_into(out: torch.Tensor, t: torch.Tensor, group=None, async_op: bool = False):
    check_device(t, group, "reduce_scatter")
    return _REDUCE_SCATTER(out, t, group=group, async_op=async_op)


def reduce(t: torch.Tensor, dst: int, group=None, async_op: bool = False):
    check_device(t, group, "reduce")
    return dist.reduce(t, dst=dst, group=group, async_op=async_op)


def broadcast(t: torch.Tensor, src: int, group=None, async_op: bool = False):
    check_device(t, group, "broadcast")
    return dist.broadcast(t, src=src, group=group, async_op=async_op)


def isend(t: torch.Tensor, dst: int, group=None):
    check_device(t, group, "send")
    return dist.isend(t, dst=dst, group=group)


def irecv(t: torch.Tensor, src: int, group=None):
    check_device(t, group, "recv")
    return dist.irecv(t, src=src, group=group)


def barrier(group=None) -> None:
    dist.barrier(group=group)
