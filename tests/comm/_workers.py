"""Rank functions spawned by the comm tests (module-level so ``spawn`` can import them)."""
from __future__ import annotations

import torch

from comm import Topology, build_exchanger

SPARSE = ("topk_ag", "gtopk", "hitopk")
DENSE = ("dense", "hier", "2dtar")


def make_input(rank: int, step: int, d: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * rank + 104729 * step + 1)
    return torch.randn(d, generator=g, dtype=torch.float64).to(dtype)


def _residual(ex):
    r = ex.memory.residual
    return None if r is None else r.clone()


def exchanges(rank, world, nodes, local_size, d, steps, density):
    """Every algorithm on this layout: dense outputs, sparse outputs and residuals per step."""
    topo = Topology(nodes=nodes, local_size=local_size)
    assert (topo.node_rank, topo.local_rank) == divmod(rank, local_size)
    out = {"dense": {}, "sparse": {}, "bf16": {}}
    x = make_input(rank, 0, d, torch.float32)
    for name in DENSE:
        out["dense"][name] = build_exchanger(name, topo).exchange(x)
    out["dense"]["dense/fp16"] = build_exchanger("dense", topo, value_dtype="fp16").exchange(x)
    for name in SPARSE:
        ex = build_exchanger(name, topo, density=density, selector="exact")
        out["sparse"][name] = [(ex.exchange(make_input(rank, s, d)), _residual(ex)) for s in range(steps)]
        ex16 = build_exchanger(name, topo, density=density, selector="exact", value_dtype="bf16")
        out["bf16"][name] = [(ex16.exchange(make_input(rank, s, d, torch.float32)), _residual(ex16))
                             for s in range(2)]
    # no error feedback: no residual is kept
    ex = build_exchanger("topk_ag", topo, density=density, selector="exact", error_feedback=False)
    ex.exchange(make_input(rank, 0, d))
    out["no_ef_residual"] = ex.memory.residual
    # a bad layout is refused before any collective, so no rank hangs
    try:
        Topology(nodes=world + 1, local_size=1)
    except ValueError as e:
        out["bad_layout"] = str(e)
    return out
