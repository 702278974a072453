"""Rank functions spawned by the comm tests (module-level so ``spawn`` can import them)."""
from __future__ import annotations

import torch

from comm import Topology, build_exchanger

SPARSE = ("topk_ag", "gtopk", "hitopk")
DENSE = ("dense", "hier", "2dtar")


def make_input(rank: int, step: int, d: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * rank + 104729 * step + 1)
    return torch.randn(d, generator=g, dtype=torch.float64).to(dtype)


def portable(obj):
    """Tensors -> numpy arrays, recursively: torch's queue pickling of tensors goes through
    shared memory that vanishes when the worker exits; numpy arrays travel by value."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().numpy().copy()
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(portable(v) for v in obj)
    return obj


def restore(obj):
    """Inverse of :func:`portable` (numpy arrays -> tensors)."""
    import numpy as np

    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, dict):
        return {k: restore(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(restore(v) for v in obj)
    return obj


def _residual(ex):
    r = ex.memory.residual
    return None if r is None else r.clone()


def exchanges(rank, world, nodes, local_size, d, steps, density):
    """Every algorithm on this layout: dense outputs, sparse outputs and residuals per step."""
    topo = Topology(nodes=nodes, local_size=local_size)
    assert (topo.node_rank, topo.local_rank) == divmod(rank, local_size)
    out = {"dense": {}, "sparse": {}, "bf16": {}, "has_shm": topo.shm is not None}
    x = make_input(rank, 0, d, torch.float32)
    for name in DENSE:
        out["dense"][name] = build_exchanger(name, topo).exchange(x)
    seg = build_exchanger("2dtar", topo)
    seg.segment_bytes = 4 * 60  # many pipelined segments (NOTE [2dtar pipelining])
    out["dense"]["2dtar/segmented"] = seg.exchange(x)
    seg = build_exchanger("hier", topo)
    seg.segment_bytes = 4 * 70
    out["dense"]["hier/segmented"] = seg.exchange(x)
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
    import os

    env = Topology.from_env()  # run_distributed sets LOCAL_WORLD_SIZE = world size
    out["from_env"] = (env.nodes, env.local_size, env.leader_group is not None)
    os.environ["LOCAL_WORLD_SIZE"] = str(world + 1)
    try:
        Topology.from_env()
    except ValueError as e:
        out["bad_env"] = str(e)
    return portable(out)


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).double()


def _batch(rank, step, n=16):
    g = torch.Generator().manual_seed(31 * rank + step)
    x = torch.randn(n, 32, generator=g, dtype=torch.float64)
    w = torch.linspace(-1, 1, 32, dtype=torch.float64)
    return x, (x @ w).unsqueeze(1) + 0.5


def training(rank, world, nodes, local_size):
    """DDP hook vs plain DDP, sparse training, GradientExchanger, overflow skip, checkpoints."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from comm import GradientExchanger, SizePlan, register_sparse_hook

    topo = Topology(nodes=nodes, local_size=local_size)
    out = {}
    # 1. density 1: every sparse algorithm gives plain DDP's gradients
    x, y = _batch(rank, 0)
    plain = DDP(_model())
    torch.nn.functional.mse_loss(plain(x), y).backward()
    ref = [p.grad.clone() for p in plain.parameters()]
    out["hook_equal"] = {}
    for name in ("hitopk", "gtopk", "topk_ag", "2dtar"):
        hooked = DDP(_model())
        register_sparse_hook(hooked, name, topo, density=1.0, selector="exact")
        torch.nn.functional.mse_loss(hooked(x), y).backward()
        out["hook_equal"][name] = [(a, p.grad.clone()) for a, p in zip(ref, hooked.parameters())]
    # 2. density 0.01 with error feedback trains the model
    model = DDP(_model())
    state = register_sparse_hook(model, "hitopk", topo, density=0.01, selector="exact")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(40):
        x, y = _batch(rank, step % 4)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out["losses"] = losses
    out["hook_state_keys"] = sorted(state.state_dict())
    # an overflow on one rank: the hook skips the bucket everywhere, residuals untouched
    before = state.state_dict()
    x, y = _batch(rank, 0)
    if rank == 0:
        x[0, 0] = float("inf")
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    after = state.state_dict()
    out["hook_overflow"] = (state.skipped_buckets, all(bool(torch.isnan(p.grad).all()) for p in model.parameters()),
                            all(torch.equal(before[i][1]["memory"]["residual"], after[i][1]["memory"]["residual"])
                                for i in before))
    # 3. GradientExchanger: several fused buckets, small ones hybrid to hier
    net = _model(1)
    ex = GradientExchanger(net.parameters(), "2dtar", topo,
                           plan=SizePlan(bucket_bytes=8 * 64 * 33, hybrid_threshold_bytes=2048))
    x, y = _batch(rank, 0)
    torch.nn.functional.mse_loss(net(x), y).backward()
    local = [p.grad.clone() for p in net.parameters()]
    ex.synchronize()
    out["fusion"] = (ex.bucket_algorithms, local, [p.grad.clone() for p in net.parameters()])
    # 4. sparse GradientExchanger: overflow on one rank skips everywhere, residuals untouched
    sparse = GradientExchanger(net.parameters(), "gtopk", topo, density=0.1, selector="exact",
                               plan=SizePlan(hybrid_threshold_bytes=0))
    for p in net.parameters():
        p.grad = torch.randn(p.shape, dtype=p.dtype, generator=torch.Generator().manual_seed(rank))
    applied = sparse.synchronize()
    before = sparse.state_dict()
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    if rank == world - 1:
        next(net.parameters()).grad[0, 0] = float("inf")
    skipped = not sparse.synchronize()
    after = sparse.state_dict()
    out["overflow"] = (applied, skipped, all(bool(torch.isnan(p.grad).all()) for p in net.parameters()),
                       all(torch.equal(a["memory"]["residual"], b["memory"]["residual"])
                           for a, b in zip(before["exchangers"], after["exchangers"])), sparse.skipped_steps)
    # 5. checkpoint round trip of the residuals
    fresh = GradientExchanger(net.parameters(), "gtopk", topo, density=0.1, selector="exact",
                              plan=SizePlan(hybrid_threshold_bytes=0))
    fresh.load_state_dict(after)
    out["reloaded"] = all(torch.equal(a["memory"]["residual"], b["memory"]["residual"])
                          for a, b in zip(after["exchangers"], fresh.state_dict()["exchangers"]))
    try:
        GradientExchanger(net.parameters(), "gtopk", topo, density=0.1, selector="exact",
                          plan=SizePlan(bucket_bytes=64)).load_state_dict(after)
    except ValueError as e:
        out["layout_error"] = str(e)
    return portable(out)
