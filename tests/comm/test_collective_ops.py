"""Every collective checks the tensor's device against the group's backend (NOTE [device check])."""
from __future__ import annotations

import torch

from comm.collective_ops import device_error
from tests.distributed import run_distributed


def test_nccl_refuses_cpu_tensors_with_a_clear_message():
    why = device_error(torch.device("cpu"), "nccl", "all_gather")
    assert why.startswith("all_gather: tensor on cpu") and "nccl" in why and "Topology.device" in why
    assert device_error(torch.device("cuda", 0), "nccl", "all_gather") is None
    assert device_error(torch.device("cpu"), "gloo", "all_reduce") is None
    assert device_error(torch.device("cpu"), "cpu:gloo,cuda:nccl", "all_reduce") is None


def _worker(rank, world):
    from comm import Topology, build_exchanger
    from comm.collective_ops import DeviceMismatchError

    topo = Topology(nodes=1, local_size=world)
    assert topo.device == torch.device("cpu")
    messages = []
    for name in ("dense", "topk_ag"):
        try:  # refused before any collective starts, on every rank alike: nobody hangs
            build_exchanger(name, topo, density=0.5, selector="exact").exchange(torch.ones(8, device="meta"))
        except DeviceMismatchError as e:
            messages.append(str(e))
    return messages


def test_gloo_group_refuses_a_meta_tensor_in_a_real_group():
    for messages in run_distributed(_worker, 2):
        assert len(messages) == 2
        assert all("tensor on meta cannot travel over a gloo process group" in m for m in messages)
